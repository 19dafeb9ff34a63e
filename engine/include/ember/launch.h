/* Failure records for `ember launch`: how a rank tells the launcher why it
 * failed, so the launcher can name the rank that failed *first* instead of
 * the ranks it stopped afterwards.
 *
 * The launcher exports EMBER_LAUNCH_DIR (a fresh directory) to every rank. A
 * failing rank writes $EMBER_LAUNCH_DIR/rank<R>.fail atomically (temp file,
 * rename) holding
 *     <unix time in ns> <rank> <host> <pid> <kind>\n<message>
 * kind is one word: "error" (a Lua error), "signal" (a fatal signal),
 * "timeout" (a collective watchdog), "cuda", ... and "terminated" for a rank
 * stopped from outside, which the launcher never names as the first failure.
 *
 * Contract: only the first record of a process is written (later calls return
 * 0); without EMBER_LAUNCH_DIR every call is a no-op returning 0. Both
 * functions may be called from any thread; the _async one also from a signal
 * handler, after em_launch_report_prepare ran. They return 1 when a record
 * was written, 0 when there was nothing to do, -1 on an I/O error (errno). */
#ifndef EMBER_LAUNCH_H
#define EMBER_LAUNCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* Write this process's failure record (see above). */
int em_launch_report_failure(const char *kind, const char *message);

/* Read EMBER_LAUNCH_DIR, the rank and the host name now, for the _async
 * variant. Returns 1 under the launcher, 0 otherwise. Call it once at start,
 * after the rank's environment is final. */
int em_launch_report_prepare(void);

/* em_launch_report_failure with async-signal-safe calls only (open, write,
 * rename, clock_gettime), using what em_launch_report_prepare read: for fatal
 * signal handlers. Returns 0 if prepare did not run or found no launcher. */
int em_launch_report_failure_async(const char *kind, const char *message);

#ifdef __cplusplus
}
#endif
#endif
