/* The scheduler's queue and running list (kv_request.h, struct sched): the order requests
 * wait in and run in, and the watermark of free blocks. Below the host tier
 * (kv_sched_tier.c) and the scheduler (kv_sched.c), which both read the queue; it calls
 * nothing of theirs. */
#include "kv_request.h"

#include <string.h>

void kv_sched_list_remove(int *list, int *n, int v)
{
    for (int i = 0; i < *n; i++)
        if (list[i] == v) {
            memmove(list + i, list + i + 1, (size_t)(*n - i - 1) * sizeof(int));
            (*n)--;
            return;
        }
}

/* Queue order: priority first; within a priority, preempted runners first (the latest
 * preempted at the front, as chapter 05 has always done), then by arrival. */
void kv_sched_queue_push(sched *S, int ri, int preempted)
{
    const runner *r = &S->r[ri];
    int at = 0;
    while (at < S->n_queue) {
        const runner *q = &S->r[S->queue[at]];
        if (q->prio < r->prio) break;
        if (q->prio == r->prio && (preempted || (q->res->preemptions == 0 &&
                                                 q->arrival > r->arrival)))
            break;
        at++;
    }
    memmove(S->queue + at + 1, S->queue + at, (size_t)(S->n_queue - at) * sizeof(int));
    S->queue[at] = ri;
    S->n_queue++;
}

/* The first runner in queue order that has arrived by the step's clock, -1 none. */
int kv_sched_head_waiting(const sched *S)
{
    for (int i = 0; i < S->n_queue; i++)
        if (S->r[S->queue[i]].arrival <= S->now) return S->queue[i];
    return -1;
}

/* Admitted runners run in priority order, oldest admission first within one: the planner
 * feeds them in this order and memory preempts from the end. */
void kv_sched_running_add(sched *S, int ri)
{
    int at = S->n_running;
    while (at > 0 && S->r[S->running[at - 1]].prio < S->r[ri].prio) at--;
    memmove(S->running + at + 1, S->running + at, (size_t)(S->n_running - at) * sizeof(int));
    S->running[at] = ri;
    S->n_running++;
}

/* Blocks kept free at admission (and, in lru mode, by background eviction). */
int kv_sched_watermark_blocks(const sched *S)
{
    return (int)((double)S->env.N * S->env.o->watermark + 0.999999);
}
