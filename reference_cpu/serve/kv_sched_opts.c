/* The scheduler's options (kv_sched.h): the names of the admission policies and preemption
 * modes, and the defaults. The bottom of the serving layer: kv_request.c, the queue and the
 * scheduler all read them, and they call nothing above. */
#include "kv_sched.h"

#include <string.h>

const char *kv_policy_name(int policy)
{
    static const char *const names[] = {"paged", "max", "pow2", "oracle"};
    return policy >= 0 && policy < 4 ? names[policy] : NULL;
}

int kv_policy_by_name(const char *name)
{
    for (int p = 0; p < 4; p++)
        if (name && strcmp(name, kv_policy_name(p)) == 0) return p;
    return -1;
}

const char *kv_preempt_name(int preempt)
{
    static const char *const names[] = {"recompute", "swap", "lru"};
    return preempt >= 0 && preempt < 3 ? names[preempt] : NULL;
}

int kv_preempt_by_name(const char *name)
{
    for (int p = 0; p < 3; p++)
        if (name && strcmp(name, kv_preempt_name(p)) == 0) return p;
    return -1;
}

kv_sched_opts kv_sched_opts_default(void)
{
    kv_sched_opts o;
    memset(&o, 0, sizeof o);
    o.policy = KV_POLICY_PAGED;
    o.token_budget = 256;
    o.max_len = 2048;
    o.step_s = 0.02;
    o.temperature = 0.0f;
    o.sample_temperature = 1.0f;
    o.top_p = 1.0f;
    o.seed = 42;
    o.preempt = KV_PREEMPT_RECOMPUTE;
    o.watermark = 0.01;
    o.link = kv_link_default();
    return o;
}
