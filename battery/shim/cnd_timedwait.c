/*
 * Preloaded before libfaketime in the battery's clock-skew fault.
 *
 * libfaketime (0.9.10, Debian's) shifts the wall clock a process reads and converts the
 * deadlines it passes to pthread_cond_timedwait back to the real clock, but it does not
 * know glibc's C11 cnd_timedwait, which librdkafka uses. A deadline that librdkafka
 * computes from its shifted clock reaches the kernel unconverted: 10 minutes behind, every
 * wait ends at once and the client spins; 10 minutes ahead, a wait for a timeout lasts 10
 * minutes. A host whose clock really is off has no such gap, since its kernel keeps the
 * same clock. This wrapper converts the deadline as libfaketime does for
 * pthread_cond_timedwait, so that only the clock is skewed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/syscall.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

int cnd_timedwait(cnd_t *restrict cond, mtx_t *restrict mutex,
                  const struct timespec *restrict deadline)
{
    static int (*next)(cnd_t *, mtx_t *, const struct timespec *);
    if (!next)
        next = (int (*)(cnd_t *, mtx_t *, const struct timespec *))dlsym(RTLD_NEXT, "cnd_timedwait");

    /* clock_gettime is libfaketime's (the shifted clock); the syscall is the kernel's. */
    struct timespec shifted, real;
    clock_gettime(CLOCK_REALTIME, &shifted);
    syscall(SYS_clock_gettime, CLOCK_REALTIME, &real);
    long long shift = (long long)(shifted.tv_sec - real.tv_sec) * 1000000000LL
                      + (shifted.tv_nsec - real.tv_nsec);
    long long at = (long long)deadline->tv_sec * 1000000000LL + deadline->tv_nsec - shift;
    struct timespec converted = { at / 1000000000LL, at % 1000000000LL };
    return next(cond, mutex, &converted);
}
