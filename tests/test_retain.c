/* Chapter 09: "selected set" retention inside the forward pass (kv_retain.h), on the CPU.
 *
 * Predicted before measured:
 *  - with a budget no sequence reaches, every method keeps and reads every position, and
 *    kv_select_attend() over the full set is kv_attention()'s passes: the forward's logits
 *    equal the plain cache's bit for bit (fp32 and int8);
 *  - the state follows the pure selectors of kv_select.h exactly: L2's incremental kept set
 *    is kv_select_l2() over every key at every step (norms never change, evicted keys would
 *    never win back); H2O's kept set and masses are a sort-based recomputation written here;
 *    SnapKV's first compression of a fresh prompt (no sinks) keeps kv_select_snapkv()'s
 *    set, which recomputes the votes as probabilities divided by their sum where attention
 *    multiplies by the reciprocal: only a vote within an ulp of the cut could differ, and
 *    random keys make none; Quest reads kv_select_quest_pages() over the pages up to the
 *    row's, top-k the union of kv_select_topk_keys() over 0 .. p; and each output row is
 *    kv_select_attend() over what the row reads;
 *  - evicted rows are never read: overwriting them with NaN after every step changes no bit;
 *  - bytes: per head kv_select_bytes_kept() of the kept rows; with nothing evicted, the codes
 *    and scales a slot holds are its share of kv_cache_bytes();
 *  - rows run in parallel but are summed in order: 1 and 2 threads give the same bits;
 *  - refusals (paged, KIVI, window, bad fields, truncate / fork / set_length) name the
 *    problem, and a reset slot starts again as a fresh one. */
#include "common/kv_test.h"

#include "kv_attention.h"
#include "kv_backend.h"
#include "kv_forward.h"
#include "kv_model.h"
#include "kv_ops.h"
#include "kv_retain.h"
#include "kv_rng.h"

#include <omp.h>
#include <string.h>

static const int METHODS[] = {KV_SELECT_L2_LARGE, KV_SELECT_L2_SMALL, KV_SELECT_H2O,
                              KV_SELECT_SNAPKV, KV_SELECT_QUEST, KV_SELECT_TOPK};
#define N_METHODS 6

/* ---- a small random model and a run over it ------------------------------------------------ */

/* L 2, H 4, H_kv 2 (G = 2), d 32: big enough that a 150-token prompt's rows go parallel. */
static int make_model(kv_model *m)
{
    kv_config c;
    memset(&c, 0, sizeof c);
    c.dim = 128;
    c.hidden_dim = 96;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.vocab_size = 48;
    c.seq_len = 256;
    kv_config_set_defaults(&c);
    kv_err e;
    if (kv_model_alloc(m, &c, &e)) {
        KV_CHECK(0, "kv_model_alloc: %s", e.msg);
        return 0;
    }
    kv_model_randomize(m, 909);
    return 1;
}

static kv_cache_spec sel_spec(int cap, int dtype, int method, int budget, int window, int sinks)
{
    kv_cache_spec s = kv_cache_spec_default(1, cap);
    s.quant.dtype = dtype;
    s.retain.select = method;
    s.retain.budget = budget;
    s.retain.window = window;
    s.retain.sinks = sinks;
    return s;
}

static int token_at(int i, int vocab) { return (i * 7 + 3 + (i / 5) * 11) % vocab; }

/* Poison: overwrite every evicted row of slot 0 (K and V, every layer and KV head) with NaN. */
static void poison_evicted(kv_cache *c)
{
    const int d = c->head_dim;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv_heads; h++) {
            const kv_select_set *kept = &kv_retain_at(c->retain, 0, l, h)->kept;
            for (int p = 0; p < c->len[0]; p++)
                if (!kv_select_set_has(kept, p))
                    for (int j = 0; j < d; j++) {
                        kv_cache_k(c, l, 0, h)[(size_t)p * d + j] = NAN;
                        kv_cache_v(c, l, 0, h)[(size_t)p * d + j] = NAN;
                    }
        }
}

/* A prompt of n_prompt tokens in chunks of @p chunk, then n_decode one-token steps, on a new
 * cache of @p spec. logits [steps][V], one row per step. Returns the step count, or -1. The
 * cache is left for the caller when @p keep is not NULL (freed otherwise). */
static int run(const kv_model *m, const kv_cache_spec *spec, int n_prompt, int chunk,
               int n_decode, float *logits, int poison, kv_cache *keep)
{
    const int V = m->config.vocab_size;
    kv_cache c;
    kv_state s;
    kv_err e;
    if (kv_retain_cache_create(&c, &m->config, spec, &e)) {
        KV_CHECK(0, "kv_cache_create: %s", e.msg);
        return -1;
    }
    kv_state_init(&s);
    int steps = 0, pos = 0, rc = KV_OK, toks[256];
    for (int i = 0; i < n_prompt + n_decode && i < 256; i++) toks[i] = token_at(i, V);
    while (!rc && pos < n_prompt + n_decode) {
        int n = pos < n_prompt ? (n_prompt - pos < chunk ? n_prompt - pos : chunk) : 1;
        kv_seq q = {0, pos, n, toks + pos, NULL};
        rc = kv_forward(m, &c, &s, &q, 1, logits + (size_t)steps * V, NULL, &e);
        pos += n;
        steps++;
        if (!rc && poison) poison_evicted(&c);
    }
    if (rc) KV_CHECK(0, "kv_forward: %s", e.msg);
    kv_state_free(&s);
    if (keep) *keep = c;
    else kv_retain_cache_free(&c);
    return rc ? -1 : steps;
}

/* ---- 1. a budget nobody reaches: the plain forward, bit for bit ---------------------------- */

static void test_full_budget(const kv_model *m)
{
    const int V = m->config.vocab_size, n_prompt = 40, n_dec = 8, cap = 64;
    const int dtypes[2] = {KV_QF_F32, KV_QF_INT8};
    float *ref = malloc((size_t)64 * V * sizeof(float)), *got = malloc((size_t)64 * V * sizeof(float));
    for (int di = 0; di < 2; di++) {
        kv_cache_spec plain = kv_cache_spec_default(1, cap);
        plain.quant.dtype = dtypes[di];
        const int steps = run(m, &plain, n_prompt, 13, n_dec, ref, 0, NULL);
        for (int mi = 0; mi < N_METHODS; mi++) {
            const int meth = METHODS[mi];
            kv_cache_spec s = sel_spec(cap, dtypes[di], meth, cap, meth == KV_SELECT_SNAPKV ? 4 : 2,
                                       meth == KV_SELECT_SNAPKV ? 0 : 1);
            if (meth == KV_SELECT_QUEST || meth == KV_SELECT_TOPK) s.retain.window = s.retain.sinks = 0;
            memset(got, 0, (size_t)64 * V * sizeof(float));
            const int st = run(m, &s, n_prompt, 13, n_dec, got, 0, NULL);
            KV_CHECK(st == steps && steps > 0 &&
                         !memcmp(got, ref, (size_t)steps * V * sizeof(float)),
                     "full budget: %s over %s differs from the plain forward",
                     kv_select_method_name(meth), kv_dtype_name(dtypes[di]));
        }
        /* and a ratio of 1: every position, whatever the length */
        kv_cache_spec s = sel_spec(cap, dtypes[di], KV_SELECT_H2O, 0, 0, 0);
        s.retain.ratio = 1.0;
        const int st = run(m, &s, n_prompt, 40, n_dec, got, 0, NULL);
        const int st2 = run(m, &plain, n_prompt, 40, n_dec, ref, 0, NULL);
        KV_CHECK(st == st2 && st > 0 && !memcmp(got, ref, (size_t)st * V * sizeof(float)),
                 "ratio 1 h2o over %s differs from the plain forward", kv_dtype_name(dtypes[di]));
    }
    free(ref);
    free(got);
}

/* ---- 2. the state against the pure selectors (no model) ----------------------------------- */

typedef struct {
    kv_config cfg;
    kv_cache c;
    kv_rng rng;
    int H, Hkv, d, G;
    float *k, *v, *q, *out; /* [n][H_kv][d] x2, [n][H][d] x2 for the largest step */
} synth;

static int synth_make(synth *s, const kv_cache_spec *spec, int L, int cap, uint64_t seed)
{
    memset(s, 0, sizeof *s);
    s->H = 4;
    s->Hkv = 2;
    s->d = 16;
    s->G = 2;
    kv_config *g = &s->cfg;
    g->dim = s->H * s->d;
    g->hidden_dim = 32;
    g->n_layers = L;
    g->n_heads = s->H;
    g->n_kv_heads = s->Hkv;
    g->vocab_size = 8;
    g->seq_len = cap;
    kv_config_set_defaults(g);
    kv_err e;
    if (kv_retain_cache_create(&s->c, g, spec, &e)) {
        KV_CHECK(0, "synth cache: %s", e.msg);
        return 0;
    }
    kv_rng_seed(&s->rng, seed);
    s->k = malloc((size_t)cap * s->Hkv * s->d * sizeof(float));
    s->v = malloc((size_t)cap * s->Hkv * s->d * sizeof(float));
    s->q = malloc((size_t)cap * s->H * s->d * sizeof(float));
    s->out = malloc((size_t)cap * s->H * s->d * sizeof(float));
    return 1;
}

static void synth_free(synth *s)
{
    kv_retain_cache_free(&s->c);
    free(s->k);
    free(s->v);
    free(s->q);
    free(s->out);
}

/* keys: 1 = small integers in {-1, 0, 1} (norm ties), 2 = clustered by page of 16 around a
 * centre per page (Quest's bounds tight), 3 = every third key zero, 4 = the first 3 keys -2
 * and the others in [0, 1] (with queries in [0, 1.5]: the first positions draw almost no
 * mass, so only the sink rule keeps them), else uniform. */
static float key_value(synth *s, int kind, int pos, int h, int j)
{
    if (kind == 4) return pos < 3 ? -2.0f : kv_rng_uniform(&s->rng, 0.0f, 1.0f);
    if (kind == 1) return (float)((int)(kv_rng_u32(&s->rng) % 3) - 1);
    if (kind == 2) {
        kv_rng r;
        kv_rng_seed(&r, 1000 + (uint64_t)(pos / 16) * 64 + (uint64_t)h * 16 + (uint64_t)j);
        return kv_rng_uniform(&r, -1.0f, 1.0f) + kv_rng_uniform(&s->rng, -0.05f, 0.05f);
    }
    if (kind == 3 && pos % 3 == 0) return 0.0f;
    return kv_rng_uniform(&s->rng, -1.0f, 1.0f);
}

/* One step of layer l: n new rows at pos written, then kv_retain_attend. */
static int synth_step(synth *s, int l, int pos, int n, int kind)
{
    const int d = s->d;
    for (int t = 0; t < n; t++)
        for (int h = 0; h < s->Hkv; h++)
            for (int j = 0; j < d; j++) {
                s->k[((size_t)t * s->Hkv + h) * d + j] = key_value(s, kind, pos + t, h, j);
                s->v[((size_t)t * s->Hkv + h) * d + j] = kv_rng_uniform(&s->rng, -1.0f, 1.0f);
            }
    for (size_t i = 0; i < (size_t)n * s->H * d; i++)
        s->q[i] = kv_rng_uniform(&s->rng, kind == 4 ? 0.0f : -1.5f, 1.5f);
    kv_err e;
    int rc = kv_cache_write_seq(&s->c, l, 0, pos, n, s->k, s->v, &e);
    if (!rc) rc = kv_retain_attend(&s->c, l, 0, pos, n, s->q, s->out, &e);
    if (rc) KV_CHECK(0, "synth step at %d: %s", pos, e.msg);
    return rc;
}

static int sets_equal(const kv_select_set *a, const int *b, int nb)
{
    return a->n == nb && (nb == 0 || !memcmp(a->pos, b, (size_t)nb * sizeof(int)));
}

/* Output row (j, query head kvh·G + g) against kv_select_attend over @p set. */
static int row_matches(synth *s, int l, int j, int kvh, const kv_select_set *set)
{
    const int d = s->d;
    const kv_head_view kh = kv_cache_view(&s->c, l, 0, kvh, KV_QROLE_KEY);
    const kv_head_view vh = kv_cache_view(&s->c, l, 0, kvh, KV_QROLE_VALUE);
    float oh[64], row[64], *att = malloc((size_t)(set->n + 1) * sizeof(float));
    int ok = 1;
    for (int g = 0; g < s->G; g++) {
        const size_t o = ((size_t)j * s->H + (size_t)kvh * s->G + g) * d;
        kv_select_attend(&kh, &vh, set, s->q + o, oh, att, row);
        ok &= !memcmp(oh, s->out + o, (size_t)d * sizeof(float));
    }
    free(att);
    return ok;
}

/* Chunks of a sequence: prompt pieces and one-token decodes mixed. */
static const int CHUNKS[] = {7, 1, 1, 9, 1, 1, 1, 12, 1, 3, 1, 1, 8, 1, 1};
#define N_CHUNKS 15

static void test_l2_incremental(void)
{
    for (int dir = 0; dir < 2; dir++)
        for (int dt = 0; dt < 2; dt++) {
            const int meth = dir ? KV_SELECT_L2_SMALL : KV_SELECT_L2_LARGE, B = 12, W = 3, S = 2;
            kv_cache_spec spec = sel_spec(64, dt ? KV_QF_F16 : KV_QF_F32, meth, B, W, S);
            synth s;
            if (!synth_make(&s, &spec, 1, 64, 21 + dir * 2 + dt)) continue;
            int pos = 0, bad = 0;
            kv_select_set ref = {0};
            kv_err e;
            for (int c = 0; c < N_CHUNKS && !bad; c++) {
                const int n = CHUNKS[c];
                if (synth_step(&s, 0, pos, n, 1)) break;
                pos += n;
                for (int h = 0; h < s.Hkv; h++) {
                    const kv_head_view kh = kv_cache_view(&s.c, 0, 0, h, KV_QROLE_KEY);
                    kv_select_l2(&kh, pos, B, !dir, W, S, &ref, &e);
                    const kv_retain_head *rh = kv_retain_at(s.c.retain, 0, 0, h);
                    if (!sets_equal(&ref, rh->kept.pos, rh->kept.n) || rh->next != pos) bad++;
                }
            }
            KV_CHECK(!bad && pos > 40, "%s over %s: the incremental kept set differs from "
                     "kv_select_l2 over all keys (%d steps bad)", kv_select_method_name(meth),
                     dt ? "fp16" : "fp32", bad);
            kv_select_set_free(&ref);
            synth_free(&s);
        }
}

/* The rows of a step read what L2 kept before it plus the step's positions: checked with a
 * snapshot of the kept set taken before each step. */
static void test_l2_reads(void)
{
    const int B = 10, W = 2, S = 1;
    kv_cache_spec spec = sel_spec(64, KV_QF_F32, KV_SELECT_L2_SMALL, B, W, S);
    synth s;
    if (!synth_make(&s, &spec, 1, 64, 77)) return;
    int pos = 0, bad = 0;
    int snap[2][64], nsnap[2];
    for (int c = 0; c < N_CHUNKS; c++) {
        const int n = CHUNKS[c];
        for (int h = 0; h < 2; h++) {
            const kv_retain_head *rh = kv_retain_at(s.c.retain, 0, 0, h);
            if (rh->kept.n) memcpy(snap[h], rh->kept.pos, (size_t)rh->kept.n * sizeof(int));
            nsnap[h] = rh->kept.n;
        }
        if (synth_step(&s, 0, pos, n, 0)) break;
        for (int j = 0; j < n; j++)
            for (int h = 0; h < 2; h++) {
                kv_select_set set = {0};
                kv_err e;
                kv_select_set_reserve(&set, 64, &e);
                memcpy(set.pos, snap[h], (size_t)nsnap[h] * sizeof(int));
                set.n = nsnap[h];
                for (int t = pos; t <= pos + j; t++) set.pos[set.n++] = t;
                bad += !row_matches(&s, 0, j, h, &set);
                kv_select_set_free(&set);
            }
        pos += n;
    }
    KV_CHECK(!bad, "l2: %d output rows differ from attention over the kept set + the step", bad);
    synth_free(&s);
}

/* H2O against a plain recomputation: masses per position in double, probabilities from
 * kv_select_attend over the reference's kept list, rows in order then heads in order; the
 * eviction by sorting (mass ascending, equal masses earlier position first). */
typedef struct {
    int pos;
    double mass;
} ranked;

static int cmp_ranked(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->mass != y->mass) return x->mass < y->mass ? -1 : 1;
    return (x->pos > y->pos) - (x->pos < y->pos);
}

static void test_h2o_reference(int S, int kind)
{
    const int B = 10, W = 2, cap = 80;
    kv_cache_spec spec = sel_spec(cap, KV_QF_F32, KV_SELECT_H2O, B, W, S);
    synth s;
    if (!synth_make(&s, &spec, 1, cap, 5)) return;
    const int d = s.d;
    int kept[2][80], nk[2] = {0, 0}; /* the reference's kept positions, ascending */
    double mass[2][80];              /* [head][position] */
    memset(mass, 0, sizeof mass);
    int pos = 0, bad_set = 0, bad_mass = 0, bad_out = 0, evicted = 0;
    float oh[16], row[16], att[80];
    for (int c = 0; c < N_CHUNKS; c++) {
        const int n = CHUNKS[c];
        if (synth_step(&s, 0, pos, n, kind)) break;
        for (int h = 0; h < 2; h++) {
            const kv_head_view kh = kv_cache_view(&s.c, 0, 0, h, KV_QROLE_KEY);
            const kv_head_view vh = kv_cache_view(&s.c, 0, 0, h, KV_QROLE_VALUE);
            for (int t = 0; t < n; t++) kept[h][nk[h]++] = pos + t;
            double step[80] = {0};
            for (int j = 0; j < n; j++) {
                int list[80], nl = 0;
                for (int i = 0; i < nk[h]; i++)
                    if (kept[h][i] <= pos + j) list[nl++] = kept[h][i];
                kv_select_set set = {list, nl, 80};
                for (int g = 0; g < s.G; g++) {
                    const size_t o = ((size_t)j * s.H + (size_t)h * s.G + g) * d;
                    kv_select_attend(&kh, &vh, &set, s.q + o, oh, att, row);
                    bad_out += memcmp(oh, s.out + o, sizeof oh) != 0;
                    for (int i = 0; i < nl; i++) step[list[i]] += att[i];
                }
            }
            for (int i = 0; i < nk[h]; i++) mass[h][kept[h][i]] += step[kept[h][i]];
            /* evict: sort the candidates, drop the first kept - B */
            ranked cand[80];
            int nc = 0;
            const int next = pos + n;
            for (int i = 0; i < nk[h]; i++)
                if (kept[h][i] >= S && kept[h][i] < next - W)
                    cand[nc++] = (ranked){kept[h][i], mass[h][kept[h][i]]};
            qsort(cand, (size_t)nc, sizeof cand[0], cmp_ranked);
            int over = nk[h] - B;
            if (over > nc) over = nc;
            for (int e = 0; e < over; e++) {
                int o2 = 0;
                for (int i = 0; i < nk[h]; i++)
                    if (kept[h][i] != cand[e].pos) kept[h][o2++] = kept[h][i];
                nk[h] = o2;
                evicted++;
            }
            const kv_retain_head *rh = kv_retain_at(s.c.retain, 0, 0, h);
            if (!(rh->kept.n == nk[h] && !memcmp(rh->kept.pos, kept[h], (size_t)nk[h] * sizeof(int))))
                bad_set++;
            else
                for (int i = 0; i < nk[h]; i++) bad_mass += rh->score[i] != mass[h][kept[h][i]];
        }
        pos += n;
    }
    KV_CHECK(!bad_set && !bad_mass && !bad_out && evicted > 20,
             "h2o (S %d): kept sets %d, masses %d, output rows %d differ from the reference "
             "(%d evicted)", S, bad_set, bad_mass, bad_out, evicted);
    KV_CHECK(kv_retain_at(s.c.retain, 0, 0, 0)->kept.pos[S > 0 ? S - 1 : 0] == (S > 0 ? S - 1 : 0) ||
                 S == 0, "h2o: sink %d evicted", S - 1);
    KV_CHECK(s.c.retain->stats[0].evicted == evicted, "h2o: stats count %lld evicted, the "
             "reference %d", (long long)s.c.retain->stats[0].evicted, evicted);
    synth_free(&s);
}

static void test_snapkv_first(void)
{
    const int n = 48, W = 4, B = 14;
    kv_cache_spec spec = sel_spec(64, KV_QF_F32, KV_SELECT_SNAPKV, B, W, 0);
    synth s;
    if (!synth_make(&s, &spec, 1, 64, 31)) return;
    if (synth_step(&s, 0, 0, n, 0)) {
        synth_free(&s);
        return;
    }
    const int d = s.d;
    for (int h = 0; h < 2; h++) {
        const kv_head_view kh = kv_cache_view(&s.c, 0, 0, h, KV_QROLE_KEY);
        float qw[4 * 2 * 16]; /* [w][G][d] the window's queries of this KV head */
        for (int i = 0; i < W; i++)
            memcpy(qw + (size_t)i * s.G * d, s.q + ((size_t)(n - W + i) * s.H + h * s.G) * d,
                   (size_t)s.G * d * sizeof(float));
        kv_select_set ref = {0};
        kv_err e;
        const int rc = kv_select_snapkv(&kh, n, qw, W, s.G, KV_RETAIN_SNAPKV_KERNEL, B, &ref, &e);
        const kv_retain_head *rh = kv_retain_at(s.c.retain, 0, 0, h);
        KV_CHECK(!rc && ref.n == B && sets_equal(&ref, rh->kept.pos, rh->kept.n),
                 "snapkv head %d: the first compression keeps %d positions, kv_select_snapkv %d "
                 "(or other ones)", h, rh->kept.n, ref.n);
        kv_select_set_free(&ref);
    }
    /* decode steps evict nothing; a second prompt step compresses to B again */
    int pos = n;
    synth_step(&s, 0, pos++, 1, 0);
    synth_step(&s, 0, pos++, 1, 0);
    KV_CHECK(kv_retain_at(s.c.retain, 0, 0, 0)->kept.n == B + 2, "snapkv: a decode step evicted");
    synth_step(&s, 0, pos, 9, 0);
    KV_CHECK(kv_retain_at(s.c.retain, 0, 0, 1)->kept.n == B, "snapkv: a second prompt keeps %d",
             kv_retain_at(s.c.retain, 0, 0, 1)->kept.n);
    synth_free(&s);
}

/* Quest (layer 0 dense, layer 1 selective) and top-k: each row's reads against the pure
 * selectors, and its output against kv_select_attend over those reads. */
static void test_query_aware(int meth)
{
    const int B = meth == KV_SELECT_QUEST ? 16 : 9, cap = 80;
    kv_cache_spec spec = sel_spec(cap, KV_QF_F32, meth, B, 0, 0);
    spec.retain.dense_layers = 1;
    synth s;
    if (!synth_make(&s, &spec, 2, cap, 41 + meth)) return;
    const int d = s.d;
    int pos = 0, bad_reads = 0, bad_out = 0, sparse_rows = 0;
    kv_select_set got = {0}, ref = {0};
    kv_err e;
    int chunks[] = {37, 1, 1, 10, 1, 1, 1, 9, 1};
    for (int c = 0; c < 9; c++) {
        const int n = chunks[c];
        for (int l = 0; l < 2; l++) {
            if (synth_step(&s, l, pos, n, 2)) return;
            for (int j = 0; j < n; j++)
                for (int h = 0; h < 2; h++) {
                    const int p = pos + j;
                    const float *qg = s.q + ((size_t)j * s.H + (size_t)h * s.G) * d;
                    kv_retain_reads(s.c.retain, 0, l, h, p, qg, &got, &e);
                    const kv_head_view kh = kv_cache_view(&s.c, l, 0, h, KV_QROLE_KEY);
                    kv_select_set_reserve(&ref, cap, &e);
                    ref.n = 0;
                    if (l == 0) {
                        for (int t = 0; t <= p; t++) ref.pos[ref.n++] = t;
                    } else if (meth == KV_SELECT_QUEST) {
                        kv_select_pages pg;
                        kv_select_pages_init(&pg, KV_SELECT_PAGE, d, &e);
                        kv_select_pages_update(&pg, &kh, pos + n, &e);
                        pg.n_pages = p / KV_SELECT_PAGE + 1;
                        int pages[8];
                        const int np = kv_select_quest_pages(&pg, qg, s.G, B / KV_SELECT_PAGE, pages);
                        for (int i = 0; i < np; i++)
                            for (int t = pages[i] * KV_SELECT_PAGE;
                                 t < (pages[i] + 1) * KV_SELECT_PAGE && t <= p; t++)
                                ref.pos[ref.n++] = t;
                        kv_select_pages_free(&pg);
                    } else {
                        char in[80] = {0};
                        int one[80];
                        for (int g = 0; g < s.G; g++) {
                            const int m = kv_select_topk_keys(&kh, p + 1, qg + (size_t)g * d, B, one);
                            for (int i = 0; i < m; i++) in[one[i]] = 1;
                        }
                        for (int t = 0; t <= p; t++)
                            if (in[t]) ref.pos[ref.n++] = t;
                    }
                    bad_reads += !sets_equal(&ref, got.pos, got.n);
                    bad_out += !row_matches(&s, l, j, h, &ref);
                    sparse_rows += ref.n < p + 1;
                }
        }
        pos += n;
    }
    KV_CHECK(!bad_reads && !bad_out && sparse_rows > 50, "%s: %d read lists and %d output rows "
             "differ from the pure selector (%d rows read a strict subset)",
             kv_select_method_name(meth), bad_reads, bad_out, sparse_rows);
    const kv_retain_stats *st = &s.c.retain->stats[0];
    KV_CHECK(st->evicted == 0 && st->rows_read < st->rows_full && st->rows_read > 0,
             "%s: stats read %lld of %lld, evicted %lld", kv_select_method_name(meth),
             (long long)st->rows_read, (long long)st->rows_full, (long long)st->evicted);
    kv_select_set_free(&got);
    kv_select_set_free(&ref);
    synth_free(&s);
}

/* ---- 3. evicted rows are never read -------------------------------------------------------- */

static void test_poison(const kv_model *m)
{
    const int V = m->config.vocab_size;
    float *a = malloc((size_t)64 * V * sizeof(float)), *b = malloc((size_t)64 * V * sizeof(float));
    const int meths[2] = {KV_SELECT_H2O, KV_SELECT_L2_LARGE};
    for (int i = 0; i < 2; i++) {
        kv_cache_spec s = sel_spec(64, KV_QF_F32, meths[i], 8, 2, 1);
        kv_cache c;
        const int n1 = run(m, &s, 30, 11, 12, a, 0, NULL);
        const int n2 = run(m, &s, 30, 11, 12, b, 1, &c);
        int finite = 1, poisoned = 0;
        for (long j = 0; n2 > 0 && j < (long)n2 * V; j++) finite &= isfinite(b[j]) != 0;
        if (n2 > 0) {
            for (int p = 0; p < c.len[0]; p++) poisoned += isnan(kv_cache_k(&c, 1, 0, 1)[p * c.head_dim]);
            kv_retain_cache_free(&c);
        }
        KV_CHECK(n1 > 0 && n1 == n2 && finite && poisoned > 20 &&
                     !memcmp(a, b, (size_t)n1 * V * sizeof(float)),
                 "%s: NaN in %d evicted rows changed the logits (finite %d)",
                 kv_select_method_name(meths[i]), poisoned, finite);
    }
    free(a);
    free(b);
}

/* ---- 4. bytes ------------------------------------------------------------------------------ */

static void test_bytes(const kv_model *m)
{
    const int V = m->config.vocab_size, d = kv_config_head_dim(&m->config);
    float *lg = malloc((size_t)64 * V * sizeof(float));
    kv_err e;
    /* evicting: per head kv_select_bytes_kept of the kept rows, each layer in its format */
    {
        kv_cache_spec s = sel_spec(64, KV_QF_INT8, KV_SELECT_L2_SMALL, 9, 2, 1);
        s.quant.dtype_layers = 1; /* layer 0 int8, layer 1 fp16 */
        kv_cache c;
        if (run(m, &s, 30, 30, 5, lg, 0, &c) > 0) {
            kv_select_bytes got, want = {0}, one;
            const int rc = kv_retain_bytes(c.retain, &s, 0, &got, &e);
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    kv_select_bytes_kept(l ? KV_QF_F16 : KV_QF_INT8, d,
                                         kv_retain_at(c.retain, 0, l, h)->kept.n, &one, &e);
                    want.rows += one.rows;
                    want.total += one.total;
                    want.index_bytes += one.index_bytes;
                }
            KV_CHECK(!rc && got.rows == 4 * 9 && got.rows == want.rows && got.total == want.total &&
                         got.index_bytes == want.index_bytes && got.total == got.code_bytes +
                         got.meta_bytes + got.index_bytes,
                     "bytes after eviction: %lld rows, %lld bytes; the heads' sum %lld, %lld",
                     (long long)got.rows, (long long)got.total, (long long)want.rows,
                     (long long)want.total);
            kv_retain_cache_free(&c);
        }
    }
    /* nothing evicted, the slot full: codes and scales = the slot's share of the cache */
    const int dtypes[4] = {KV_QF_F32, KV_QF_INT8, KV_QF_FP8_E4M3, KV_QF_INT8_G32};
    for (int i = 0; i < 4; i++) {
        kv_cache_spec s = sel_spec(48, dtypes[i], KV_SELECT_QUEST, 16, 0, 0);
        s.n_slots = 2;
        s.quant.fp8_per_head = 1;
        if (i == 3) s.quant.dtype_layers = 2;
        kv_cache c;
        if (run(m, &s, 40, 40, 8, lg, 0, &c) <= 0) continue;
        kv_select_bytes got;
        const int rc = kv_retain_bytes(c.retain, &s, 0, &got, &e);
        KV_CHECK(!rc && c.len[0] == 48 && got.total - got.index_bytes == (int64_t)kv_cache_bytes(&c) / 2,
                 "%s: a full slot's kept bytes %lld - %lld != half of kv_cache_bytes %zu",
                 kv_dtype_name(dtypes[i]), (long long)got.total, (long long)got.index_bytes,
                 kv_cache_bytes(&c));
        kv_retain_cache_free(&c);
    }
    free(lg);
}

/* ---- 5. thread counts ---------------------------------------------------------------------- */

static void test_threads(const kv_model *m)
{
    const int V = m->config.vocab_size, threads = omp_get_max_threads();
    float *a = malloc((size_t)8 * V * sizeof(float)), *b = malloc((size_t)8 * V * sizeof(float));
    kv_parallel_ignore_load(1);
    for (int mi = 0; mi < N_METHODS; mi++) {
        const int meth = METHODS[mi];
        const int sn = meth == KV_SELECT_QUEST || meth == KV_SELECT_TOPK;
        kv_cache_spec s = sel_spec(160, KV_QF_F32, meth, sn ? 32 : 24, sn ? 0 : 4, sn ? 0 : 1);
        kv_cache ca, cb;
        omp_set_num_threads(1);
        const int n1 = run(m, &s, 150, 150, 3, a, 0, &ca);
        omp_set_num_threads(2);
        const int n2 = run(m, &s, 150, 150, 3, b, 0, &cb);
        if (n1 > 0 && n2 > 0) {
            const kv_retain_stats *x = &ca.retain->stats[0], *y = &cb.retain->stats[0];
            int same_state = 1; /* kept lists and their scores (masses, votes, norms) */
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++) {
                    const kv_retain_head *p = kv_retain_at(ca.retain, 0, l, h);
                    const kv_retain_head *q = kv_retain_at(cb.retain, 0, l, h);
                    same_state &= p->kept.n == q->kept.n &&
                                  !memcmp(p->kept.pos, q->kept.pos, (size_t)p->kept.n * sizeof(int)) &&
                                  !memcmp(p->score, q->score, (size_t)p->kept.n * sizeof(double));
                }
            KV_CHECK(n1 == n2 && !memcmp(a, b, (size_t)n1 * V * sizeof(float)) && same_state &&
                         !memcmp(x, y, sizeof *x) && x->rows_read < x->rows_full,
                     "%s: 1 and 2 threads differ (read %lld of %lld)",
                     kv_select_method_name(meth), (long long)x->rows_read,
                     (long long)x->rows_full);
        }
        if (n1 > 0) kv_retain_cache_free(&ca);
        if (n2 > 0) kv_retain_cache_free(&cb);
    }
    omp_set_num_threads(threads);
    kv_parallel_ignore_load(0);
    free(a);
    free(b);
}

/* ---- 6. refusals and reset ----------------------------------------------------------------- */

static void expect_refused(const kv_model *m, kv_cache_spec s, int want, const char *word,
                           const char *what)
{
    kv_cache c;
    kv_err e;
    memset(&e, 0, sizeof e);
    const int rc = kv_retain_cache_create(&c, &m->config, &s, &e);
    KV_CHECK(rc == want && strstr(e.msg, word), "%s: got %d (%s), want %d naming \"%s\"", what,
             rc, e.msg, want, word);
    if (!rc) kv_retain_cache_free(&c);
}

static void test_refusals(const kv_model *m)
{
    const kv_cache_spec ok = sel_spec(64, KV_QF_F32, KV_SELECT_H2O, 8, 2, 1);
    kv_cache_spec s = ok;
    s.layout.kind = KV_LAYOUT_PAGED;
    s.layout.block_size = 16;
    s.layout.n_blocks = 8;
    expect_refused(m, s, KV_ERR_UNSUPPORTED, "paged", "paged");
    s = ok;
    s.quant.dtype = KV_QF_INT4_KIVI;
    expect_refused(m, s, KV_ERR_UNSUPPORTED, "KIVI", "kivi");
    s = ok;
    s.window.size = 16;
    expect_refused(m, s, KV_ERR_UNSUPPORTED, "window", "window");
    s = ok;
    s.retain.budget = 0;
    expect_refused(m, s, KV_ERR_ARG, "budget", "no budget");
    s = ok;
    s.retain.ratio = 0.5;
    expect_refused(m, s, KV_ERR_ARG, "budget", "budget and ratio");
    s = ok;
    s.retain.budget = 0;
    s.retain.ratio = 1.5;
    expect_refused(m, s, KV_ERR_ARG, "ratio", "ratio 1.5");
    s = ok;
    s.retain.budget = -3;
    expect_refused(m, s, KV_ERR_ARG, "budget", "negative budget");
    s = ok;
    s.retain.window = 6;
    s.retain.sinks = 3;
    expect_refused(m, s, KV_ERR_ARG, "budget", "sinks + window over the budget");
    s = ok;
    s.retain.window = -1;
    expect_refused(m, s, KV_ERR_ARG, "window", "negative window");
    s = ok;
    s.retain.sinks = -1;
    expect_refused(m, s, KV_ERR_ARG, "sinks", "negative sinks");
    s = ok;
    s.retain.select = KV_SELECT_SNAPKV;
    s.retain.window = 0;
    expect_refused(m, s, KV_ERR_ARG, "window", "snapkv without a window");
    s = ok;
    s.retain.dense_layers = -1;
    expect_refused(m, s, KV_ERR_ARG, "dense", "negative dense layers");
    s = ok;
    s.retain.select = KV_SELECT_H2O;
    s.retain.dense_layers = 1;
    expect_refused(m, s, KV_ERR_ARG, "query-aware", "dense layers on an evicting method");
    s = ok;
    s.retain.select = 17;
    expect_refused(m, s, KV_ERR_ARG, "unknown", "unknown method");
    s = kv_cache_spec_default(1, 64);
    s.retain.budget = 8;
    expect_refused(m, s, KV_ERR_ARG, "without a selection", "fields without a method");
    s = ok;
    kv_err e;
    KV_CHECK(kv_cache_spec_check_caps("check", &m->config, &s, KV_CACHE_CAN_WINDOW, &e) == KV_OK &&
                 kv_cache_spec_check("check", &m->config, &s, &e) == KV_OK,
             "a valid retention spec refused: %s", e.msg);
    KV_CHECK(kv_select_method_parse("snapkv") == KV_SELECT_SNAPKV &&
                 kv_select_method_parse("bogus") == -1 &&
                 !strcmp(kv_select_method_name(KV_SELECT_L2_SMALL), "l2-small") &&
                 kv_select_method_evicts(KV_SELECT_H2O) && !kv_select_method_evicts(KV_SELECT_QUEST),
             "method names");

    /* cache operations that would desynchronize the state; reset starts afresh, through the
     * backend that serves a plain run */
    const int V = m->config.vocab_size;
    float *a = malloc((size_t)16 * V * sizeof(float)), *b = malloc((size_t)16 * V * sizeof(float));
    kv_backend *be = NULL;
    if (kv_backend_cpu(&be, m, &ok, &e)) {
        KV_CHECK(0, "kv_backend_cpu: %s", e.msg);
        free(a);
        free(b);
        return;
    }
    int toks[32];
    for (int i = 0; i < 32; i++) toks[i] = token_at(i, V);
    for (int round = 0; round < 2; round++) {
        float *lg = round ? b : a;
        kv_seq q = {0, 0, 20, toks, NULL};
        int rc = be->forward(be, &q, 1, lg, NULL, &e);
        for (int t = 20; !rc && t < 26; t++) {
            kv_seq d1 = {0, t, 1, toks + t, NULL};
            rc = be->forward(be, &d1, 1, lg + (size_t)(t - 19) * V, NULL, &e);
        }
        KV_CHECK(!rc, "backend run %d: %s", round, e.msg);
        kv_cache *c = kv_backend_cpu_cache(be);
        if (round == 0) {
            memset(&e, 0, sizeof e);
            KV_CHECK(be->rollback->truncate(be, 0, 20, &e) == KV_ERR_UNSUPPORTED &&
                         strstr(e.msg, "retention"),
                     "backend truncate: %s", e.msg);
            memset(&e, 0, sizeof e);
            KV_CHECK(kv_cache_fork_slot(c, 0, 0, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "retention"),
                     "fork_slot: %s", e.msg);
            memset(&e, 0, sizeof e);
            KV_CHECK(kv_cache_set_length(c, 0, 3, &e) == KV_ERR_UNSUPPORTED && strstr(e.msg, "retention"),
                     "set_length: %s", e.msg);
            KV_CHECK(be->length(be, 0) == 26 && kv_retain_at(c->retain, 0, 1, 1)->kept.n == 8 &&
                         c->retain->stats[0].evicted > 0, "retention state after the run");
            be->reset(be, 0);
            const kv_retain_stats *st = &c->retain->stats[0];
            int empty = st->rows_read == 0 && st->rows_full == 0 && st->evicted == 0;
            for (int l = 0; l < 2; l++)
                for (int h = 0; h < 2; h++)
                    empty &= kv_retain_at(c->retain, 0, l, h)->next == 0 &&
                             kv_retain_at(c->retain, 0, l, h)->kept.n == 0;
            KV_CHECK(empty && be->length(be, 0) == 0, "reset left selection state behind");
        }
    }
    KV_CHECK(!memcmp(a, b, (size_t)7 * V * sizeof(float)),
             "a reset slot's second run differs from the first");
    kv_backend_destroy(be);
    free(a);
    free(b);
}

int main(void)
{
    kv_model m;
    memset(&m, 0, sizeof m);
    if (!make_model(&m)) return kv_test_finish();
    test_full_budget(&m);
    test_l2_incremental();
    test_l2_reads();
    test_h2o_reference(1, 3);
    test_h2o_reference(2, 4);
    test_snapkv_first();
    test_query_aware(KV_SELECT_QUEST);
    test_query_aware(KV_SELECT_TOPK);
    test_poison(&m);
    test_bytes(&m);
    test_threads(&m);
    test_refusals(&m);
    kv_model_free(&m);
    return kv_test_finish();
}
