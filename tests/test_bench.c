/* The machine measurements the benchmarks stand on (kv_bench.h): the read bandwidth in order
 * and over shuffled chunks, the LLC size, the weight bytes of a decode token. Not timings to
 * compare against numbers (those depend on the machine): the accounting around them.
 *
 * Predicted before run:
 *  - a chunk that is not a multiple of 8 bytes, or larger than the buffer, is refused with
 *    KV_ERR_ARG and a message naming the chunk;
 *  - a run counts whole chunks only: 10 000 bytes in chunks of 4096 is 8192 bytes summed;
 *    chunks of 0 bytes read the buffer in order, all of it;
 *  - slowest <= median <= fastest, all positive; threads and repeats as asked (repeats
 *    clamped to 1..64, 0 meaning 7);
 *  - kv_decode_weight_bytes() of the 15M llama2.c shape is its fp32 parameter count, worked
 *    out by hand below, times 4. */
#include "kv_bench.h"
#include "kv_config.h"
#include "common/kv_test.h"

#include <omp.h>
#include <string.h>

static void check_run(const char *what, size_t buffer, size_t chunk, int repeats,
                      double want_bytes, int want_repeats)
{
    kv_bandwidth bw;
    kv_err err = {{0}};
    const int rc = kv_read_bandwidth_chunks(&bw, buffer, chunk, repeats, &err);
    KV_CHECK(rc == KV_OK, "%s: %s", what, err.msg);
    if (rc) return;
    KV_CHECK(bw.buffer_bytes == want_bytes, "%s: %.0f bytes summed, want %.0f", what,
             bw.buffer_bytes, want_bytes);
    KV_CHECK(bw.min > 0 && bw.min <= bw.bytes_per_s && bw.bytes_per_s <= bw.max,
             "%s: slowest %.3g, median %.3g, fastest %.3g", what, bw.min, bw.bytes_per_s, bw.max);
    KV_CHECK(bw.threads == omp_get_max_threads() && bw.repeats == want_repeats,
             "%s: %d threads, %d repeats (want %d, %d)", what, bw.threads, bw.repeats,
             omp_get_max_threads(), want_repeats);
}

static void expect_refused(size_t buffer, size_t chunk, const char *want)
{
    kv_bandwidth bw;
    kv_err err = {{0}};
    const int rc = kv_read_bandwidth_chunks(&bw, buffer, chunk, 1, &err);
    KV_CHECK(rc == KV_ERR_ARG, "chunk %zu of %zu: status %s, want KV_ERR_ARG", chunk, buffer,
             kv_status_name(rc));
    KV_CHECK(strstr(err.msg, want) != NULL, "chunk %zu: message '%s' lacks '%s'", chunk,
             err.msg, want);
}

int main(void)
{
    expect_refused(1 << 20, 100, "100 bytes");
    expect_refused(4096, 8192, "8192 bytes");
    check_run("in order", 1 << 20, 0, 3, 1 << 20, 3);
    check_run("whole chunks", 10000, 4096, 1, 8192, 1);
    check_run("4 KiB chunks", 4 << 20, 4096, 0, 4 << 20, 7);
    check_run("one chunk", 65536, 65536, 99, 65536, 64);
    KV_CHECK(kv_read_bandwidth(&(kv_bandwidth){0}, 1 << 20, 1, NULL) == KV_OK,
             "kv_read_bandwidth with a NULL error record");

    /* 15M: dim 288, L 6, H = H_kv = 6 (d 48), hidden 768, V 32000:
     * P = 6 (288·288 + 2·288·288 + 288·288 + 3·288·768) = 6 · 995 328 = 5 971 968
     * + dim·V 9 216 000 + dim 288 + (2·6 + 1)·288 = 3 744 -> 15 192 000 floats */
    kv_config c = {0};
    c.dim = 288, c.hidden_dim = 768, c.n_layers = 6, c.n_heads = 6, c.n_kv_heads = 6;
    c.vocab_size = 32000, c.seq_len = 256;
    kv_config_set_defaults(&c);
    KV_CHECK(kv_decode_weight_bytes(&c) == 4.0 * 15192000.0, "15M weight bytes %.0f, want %.0f",
             kv_decode_weight_bytes(&c), 4.0 * 15192000.0);
    return kv_test_finish();
}
