/* A wall clock off by SKEWED_CLOCK_SECONDS for the process it is preloaded into (LD_PRELOAD):
 * CLOCK_REALTIME alone, as a host whose clock is set wrong has it; the monotonic clock, sleeps
 * and timed waits are left alone. libfaketime does more and, with Python, too much: under it
 * every timed wait of Python's locks hangs, and time.sleep fails with EINVAL where the
 * monotonic clock is spared. Built by tests/network/_fleet.py with the C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <time.h>
#include <sys/time.h>

static long long offset_ns(void) {
    static long long cached = -1;
    static int read = 0;
    if (!read) {
        const char *text = getenv("SKEWED_CLOCK_SECONDS");
        cached = text ? (long long)(atof(text) * 1e9) : 0;
        read = 1;
    }
    return cached;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_ns();
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    static int (*real)(clockid_t, struct timespec *) = NULL;
    if (!real) real = dlsym(RTLD_NEXT, "clock_gettime");
    int result = real(clock, ts);
    if (result == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE)) shift(ts);
    return result;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int result = clock_gettime(CLOCK_REALTIME, &ts);
    if (result == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    return result;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
