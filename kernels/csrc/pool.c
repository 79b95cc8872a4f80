/* The thread pool the matmul and attention kernels split their work over.
 *
 * A job is `total` chunks; the calling thread and the workers claim them one at a time
 * from an atomic counter, so a worker the OS has not scheduled yet (a loaded machine)
 * costs nothing: the caller takes its share and waits only for chunks already claimed.
 * (OpenMP's barrier would wait for every thread to arrive.) Workers spin briefly between
 * jobs, since a decode step issues one every few tens of microseconds, then sleep. */
#include "qmatmul.h"

#ifndef _WIN32
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <time.h>
#endif

static int num_threads = 1;

int pool_num_threads(void) { return num_threads; }

#if HAVE_THREADS
#define MAX_WORKERS 255
/* Timings (ns), measured on the 2-core dev machine; see worker_main and parallel_for. */
#define PREEMPTED_NS 50000      /* a gap this long in its poll loop: it was descheduled */
#define NO_POLL_NS 5000000LL    /* then no worker polls for this long */
#define WINDOW_JOBS 64          /* the pool's speed is judged over this many jobs */
#define WINDOW_NS 20000000LL    /* or this long, whichever comes first */
#define MIN_BACKOFF_NS 2000000LL /* a slow window: jobs run on the caller alone 2 ms ... 2 s */
#define MAX_BACKOFF_NS 2000000000LL

static struct {
    pthread_mutex_t job_lock; /* one job at a time (Python threads may call concurrently) */
    pthread_mutex_t sleep_lock;
    pthread_cond_t wake;
    atomic_uint_fast64_t claim; /* (total << 32) | next unclaimed chunk */
    atomic_llong done;          /* chunks of the current job finished */
    atomic_int sleepers;
    atomic_int epoch; /* bumped when the thread count changes: older workers exit */
    atomic_llong spin_ns; /* how long workers poll after the current job */
    atomic_ullong no_poll_until_ns; /* see worker_main */
    unsigned long wake_gen; /* under sleep_lock */
    ChunkFn fn;
    const void *ctx;
    int num_workers;
    uint64_t serial_until_ns, backoff_ns; /* under job_lock: see parallel_for */
    long long window_jobs, window_wall_ns, window_alone_ns; /* the current window's */
    long long num_jobs, num_stalls, wait_ns; /* for info(); stalls: slow windows, each a back-off */
} pool = {.job_lock = PTHREAD_MUTEX_INITIALIZER,
          .sleep_lock = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Claim and run chunks of the current job until none is left; how many it ran. */
static long long run_chunks(void) {
    for (long long ran = 0;; ran++) {
        uint64_t c = atomic_load(&pool.claim);
        for (;;) {
            if ((c & 0xffffffffu) >= (c >> 32)) return ran;
            if (atomic_compare_exchange_weak(&pool.claim, &c, c + 1)) break;
        }
        /* the job cannot change before this chunk is counted done, so fn/ctx are its own */
        pool.fn(pool.ctx, (Py_ssize_t)(c & 0xffffffffu));
        atomic_fetch_add(&pool.done, 1);
    }
}

static int work_pending(void) {
    const uint64_t c = atomic_load(&pool.claim);
    return (c & 0xffffffffu) < (c >> 32);
}

/* The calling thread's involuntary context switches so far, or -1 where the OS does not
 * count them per thread. */
static long involuntary_switches(void) {
#ifdef RUSAGE_THREAD
    struct rusage usage;
    if (getrusage(RUSAGE_THREAD, &usage) == 0) return usage.ru_nivcsw;
#endif
    return -1;
}

/* Polling between jobs wins on idle cores, but where other processes want them a polling
 * worker takes CPU time from the caller (measured: 2 threads decoded at 59 tok/s polling
 * 300 us, 99 polling none, beside one busy process). A worker that finds it was
 * descheduled mid-poll for another thread of this OS (a gap with an involuntary switch
 * counted) therefore stops polling, for every worker, for NO_POLL_NS. A gap without one
 * was the hypervisor pausing the virtual CPU, ~20 times a second on the idle dev VM; and
 * kernel threads preempt an idle machine's worker too, ~8 times a second. Taking every
 * gap for load for 50 ms kept the pool asleep most of the time: the default model's
 * decode step went 4.0 -> 2.9 ms, its 8-row verify 8.5 -> 6.9 ms, once gaps were told
 * apart and the pause cut to 5 ms (beside a busy process: 4.4 -> 3.9 ms). */
static void *worker_main(void *arg) {
    const int epoch = (int)(intptr_t)arg;
    long switches = involuntary_switches();
    while (atomic_load(&pool.epoch) == epoch) {
        const uint64_t start = now_ns();
        uint64_t spin_ns = (uint64_t)atomic_load(&pool.spin_ns), last = start;
        if (start < atomic_load(&pool.no_poll_until_ns)) spin_ns = 0;
        int spins = 0;
        while (!work_pending() && atomic_load(&pool.epoch) == epoch) {
            cpu_relax();
            if (++spins % 256 != 0) continue;
            const uint64_t t = now_ns();
            if (t - last > PREEMPTED_NS) {
                const long now_switches = involuntary_switches();
                if (now_switches < 0 || now_switches != switches) {
                    atomic_store(&pool.no_poll_until_ns, t + NO_POLL_NS);
                    spin_ns = 0;
                }
                switches = now_switches;
            }
            last = t;
            if (t - start >= spin_ns) {
                pthread_mutex_lock(&pool.sleep_lock);
                const unsigned long gen = pool.wake_gen;
                atomic_fetch_add(&pool.sleepers, 1);
                /* seq_cst: either this sees the job or its publisher sees a sleeper */
                while (!work_pending() && gen == pool.wake_gen && atomic_load(&pool.epoch) == epoch)
                    pthread_cond_wait(&pool.wake, &pool.sleep_lock);
                atomic_fetch_sub(&pool.sleepers, 1);
                pthread_mutex_unlock(&pool.sleep_lock);
                break;
            }
        }
        run_chunks();
    }
    return NULL;
}

/* Start num_threads - 1 workers once (again in a forked child). Call under job_lock. */
static void ensure_workers(void) {
    const int want = num_threads - 1 < MAX_WORKERS ? num_threads - 1 : MAX_WORKERS;
    while (pool.num_workers < want) {
        pthread_t thread;
        void *epoch = (void *)(intptr_t)atomic_load(&pool.epoch);
        if (pthread_create(&thread, NULL, worker_main, epoch) != 0) break;
        pthread_detach(thread);
        pool.num_workers++;
    }
}

/* fork(): the child has none of the workers, and takes the pool between jobs. */
static void before_fork(void) {
    pthread_mutex_lock(&pool.job_lock);
    pthread_mutex_lock(&pool.sleep_lock);
}

static void after_fork_in_parent(void) {
    pthread_mutex_unlock(&pool.sleep_lock);
    pthread_mutex_unlock(&pool.job_lock);
}

static void after_fork_in_child(void) {
    pool.num_workers = 0;
    atomic_store(&pool.sleepers, 0);
    atomic_store(&pool.claim, 0);
    pthread_cond_init(&pool.wake, NULL); /* the parent's sleepers are not waiting here */
    pthread_mutex_unlock(&pool.sleep_lock);
    pthread_mutex_unlock(&pool.job_lock);
}

/* Run fn(ctx, 0..total-1) across the pool; returns when every chunk is done. Workers then
 * poll for spin_ns before sleeping: long after a decode matmul (the next comes within
 * microseconds), zero before BLAS (whose own threads want the cores).
 *
 * When the cores are shared with other busy processes, a worker the OS preempts while it
 * holds a chunk keeps the caller waiting for it (measured: 2 threads decoded at 64 tok/s
 * where 1 thread did 100, next to one busy process). Whether the pool still pays is judged
 * over a window of jobs: each job's time against what the caller alone would have taken
 * (its own chunks' time per chunk, times the job's chunks). A window slower than the
 * caller alone sends jobs to the caller alone for a back-off (doubling while windows stay
 * slow), then the pool is tried again. Judging jobs one by one (a job that waited longer
 * than it worked was a stall) went serial beside a process that takes a quarter of a core
 * in bursts: 52 tok/s, the speed of one thread, where two decoded 81 alone. */
void parallel_for(ChunkFn fn, const void *ctx, Py_ssize_t total, long long spin_ns) {
    if (total <= 1 || num_threads <= 1) {
        for (Py_ssize_t i = 0; i < total; i++) fn(ctx, i);
        return;
    }
    pthread_mutex_lock(&pool.job_lock);
    const uint64_t start = now_ns();
    if (start < pool.serial_until_ns) {
        for (Py_ssize_t i = 0; i < total; i++) fn(ctx, i);
        pthread_mutex_unlock(&pool.job_lock);
        return;
    }
    ensure_workers();
    pool.fn = fn;
    pool.ctx = ctx;
    atomic_store(&pool.spin_ns, spin_ns);
    atomic_store(&pool.done, 0);
    atomic_store(&pool.claim, (uint64_t)total << 32); /* publishes fn and ctx */
    if (atomic_load(&pool.sleepers) > 0) {
        pthread_mutex_lock(&pool.sleep_lock);
        pool.wake_gen++;
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    const long long mine = run_chunks();
    const uint64_t worked = now_ns();
    for (int spins = 1; atomic_load(&pool.done) < total; spins++) {
        cpu_relax();
        if (spins % 1024 == 0) sched_yield(); /* let a preempted worker on this core run */
    }
    const uint64_t end = now_ns();
    pool.num_jobs++;
    pool.wait_ns += (long long)(end - worked);
    if (mine > 0) { /* the caller's chunks priced the job on the caller alone */
        pool.window_jobs++;
        pool.window_wall_ns += (long long)(end - start);
        pool.window_alone_ns += (long long)(worked - start) * total / mine;
    }
    if (pool.window_jobs >= WINDOW_JOBS || pool.window_wall_ns >= WINDOW_NS) {
        if (pool.window_wall_ns > pool.window_alone_ns) {
            const uint64_t doubled = 2 * pool.backoff_ns;
            pool.backoff_ns = doubled < MIN_BACKOFF_NS   ? MIN_BACKOFF_NS
                              : doubled > MAX_BACKOFF_NS ? MAX_BACKOFF_NS
                                                         : doubled;
            pool.serial_until_ns = end + pool.backoff_ns;
            pool.num_stalls++;
        } else if (pool.backoff_ns && end > pool.serial_until_ns + 4 * pool.backoff_ns) {
            pool.backoff_ns = 0; /* fast for a while: the next slow window starts anew */
        }
        pool.window_jobs = pool.window_wall_ns = pool.window_alone_ns = 0;
    }
    pthread_mutex_unlock(&pool.job_lock);
}
#else
void parallel_for(ChunkFn fn, const void *ctx, Py_ssize_t total, long long spin_ns) {
    (void)spin_ns;
    for (Py_ssize_t i = 0; i < total; i++) fn(ctx, i);
}
#endif

#if HAVE_THREADS
void pool_set_num_threads(int n) {
    pthread_mutex_lock(&pool.job_lock);
    if (n != num_threads) { /* retire the workers; the next job starts n - 1 fresh ones */
        num_threads = n;
        atomic_fetch_add(&pool.epoch, 1);
        pool.num_workers = 0;
        pthread_mutex_lock(&pool.sleep_lock);
        pool.wake_gen++;
        pthread_cond_broadcast(&pool.wake);
        pthread_mutex_unlock(&pool.sleep_lock);
    }
    pthread_mutex_unlock(&pool.job_lock);
}

int pool_register_fork_handlers(void) {
    static int registered = 0;
    if (!registered && pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child))
        return -1;
    registered = 1;
    return 0;
}

void pool_stats(long long *num_jobs, long long *num_stalls, long long *wait_ns) {
    *num_jobs = pool.num_jobs;
    *num_stalls = pool.num_stalls;
    *wait_ns = pool.wait_ns;
}
#else
void pool_set_num_threads(int n) { (void)n; /* built without threads: always 1 */ }

int pool_register_fork_handlers(void) { return 0; }

void pool_stats(long long *num_jobs, long long *num_stalls, long long *wait_ns) {
    *num_jobs = *num_stalls = *wait_ns = 0;
}
#endif
