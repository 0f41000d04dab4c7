/*
 * livecov.h - live LLVM coverage from inside a running C/C++ program.
 *
 * liblivecov (liblivecov.so, liblivecov.a) runs the livecov agent in the
 * process: it serves the program's coverage, now, as LCOV over a Unix
 * socket ($LIVECOV_DIR/sockets/<instance>.sock) and optionally TCP, writes
 * reports to $LIVECOV_DIR/reports/, and answers the calls below. The
 * program must be built with clang's -fprofile-instr-generate
 * -fcoverage-mapping (or any LLVM-instrumented toolchain).
 *
 * Preloaded (LD_PRELOAD=liblivecov.so) or linked dynamically (-llivecov),
 * the library starts the agent by itself before main() when LIVECOV_DIR or
 * LIVECOV_LISTEN is set: no call is needed. Linked statically
 * (liblivecov.a), the program calls livecov_start().
 *
 * Every function returns a status (enum livecov_status); on failure,
 * livecov_last_error() says why. No function ever unwinds or aborts into
 * the caller.
 *
 * Threads: every function may be called from any thread, concurrently;
 * dumps and resets are serialized inside. livecov_last_error() is per
 * thread. No function is async-signal-safe: never call one from a signal
 * handler. After fork(), the child runs an agent of its own (a new
 * instance, started by the library) and the functions act on it.
 *
 * Configuration string (livecov_start): "key=value" entries separated by
 * ';', e.g. "dir=/tmp/cov;listen=127.0.0.1:0;token=x;flush_secs=1".
 * A literal ';' inside a value is written ";;". Spaces around keys and
 * values are ignored; an unknown key, a repeated key or a bad value is
 * LIVECOV_BAD_CONFIG. The keys are those of the environment variables, in
 * lower case without LIVECOV_:
 *   dir=PATH          coverage directory (sockets/ and reports/ are made in it)
 *   listen=ADDR:PORT  also serve on TCP (port 0: any free port)
 *   token=SECRET      bearer token required on TCP
 *   token_file=PATH   the token, read from a file
 *   ignore=REGEX      source files left out of reports
 *                     (default: toolchain and package-registry sources)
 *   demangle=0        function names as the compiler wrote them
 *   flush_secs=N      write reports/<instance>.lcov every N seconds
 *   path_map=FROM=TO[,FROM=TO]  rewrite SF: path prefixes
 *   socket_mode=0600  mode of the socket file (octal)
 * The empty string "" starts an agent without socket or TCP: the program
 * reads its coverage through livecov_dump() and livecov_write_report().
 */
#ifndef LIVECOV_H
#define LIVECOV_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LIVECOV_VERSION_MAJOR 0
#define LIVECOV_VERSION_MINOR 1

/* What every function returns. */
enum livecov_status {
    /* Done. */
    LIVECOV_OK = 0,
    /* No agent runs: livecov_start() first (or it was stopped). */
    LIVECOV_NOT_STARTED = 1,
    /* The configuration string or the LIVECOV_* environment is invalid. */
    LIVECOV_BAD_CONFIG = 2,
    /* A file, directory or socket could not be made, bound or written. */
    LIVECOV_IO = 3,
    /* No LLVM-instrumented module is loaded in the process. */
    LIVECOV_NO_COVERAGE = 4,
    /* An agent already runs (with its own configuration); not a failure of
       the running agent. Also: another copy of livecov runs one. */
    LIVECOV_ALREADY_STARTED = 5,
    /* livecov_start(NULL) with neither LIVECOV_DIR nor LIVECOV_LISTEN set:
       nothing was asked for, the agent stays off. */
    LIVECOV_DISABLED = 6,
    /* A NULL output pointer, a string that is not UTF-8, an empty path... */
    LIVECOV_INVALID_ARGUMENT = 7,
    /* An instrumented module's coverage data cannot be read. */
    LIVECOV_BAD_COVERAGE = 8,
    /* A bug in livecov (caught; the program is unharmed). */
    LIVECOV_INTERNAL = 9
};

/*
 * Starts the agent. config: NULL reads the LIVECOV_* environment (returns
 * LIVECOV_DISABLED when it asks for nothing, LIVECOV_OK when an agent
 * already runs); otherwise a configuration string (see above; returns
 * LIVECOV_ALREADY_STARTED when an agent already runs). Cheap: coverage
 * mappings are read at the first dump, not here.
 */
int livecov_start(const char *config);

/*
 * The LCOV report of the counts since start or the last reset, computed as
 * `llvm-cov export -format=lcov` would. test_name: NULL or "" for none,
 * else written as TN:<name>. reset: nonzero makes this the zero of later
 * reports, in the same step (no hit lost in between). On LIVECOV_OK, *out
 * is a NUL-terminated buffer to free with livecov_free(), and *len (if len
 * is not NULL) its length without the NUL; otherwise *out is NULL.
 */
int livecov_dump(const char *test_name, int reset, char **out, size_t *len);

/* Frees a buffer of livecov_dump(). NULL is allowed. */
void livecov_free(void *buffer);

/* Makes the current counts the zero of later reports (the program's own
   counters and its exit profile are not touched). */
int livecov_reset(void);

/*
 * Writes the report (counts since start or the last reset) to path, or,
 * when path is NULL, to reports/<instance>.lcov of the agent's directory.
 * Written to a temporary name and renamed: never a torn file.
 */
int livecov_write_report(const char *path);

/*
 * Stops the agent: it stops serving, writes its final report and metadata
 * (state "exited"), removes its socket, and puts SIGTERM/SIGINT back to
 * their default action if it had installed its handler. Waits for requests
 * in flight (at most 2 s). A later livecov_start() makes a new instance
 * whose counts begin at this stop.
 */
int livecov_stop(void);

/*
 * Why this thread's last livecov_* call failed; "" after a success. Never
 * NULL. Valid until the thread's next livecov_* call.
 */
const char *livecov_last_error(void);

/* The running agent's instance id (e.g. "native-4711-9f2c3a1b0d4e5f60"),
   or NULL. The string stays valid for the life of the process. */
const char *livecov_instance(void);

/* "LIVECOV_OK", "LIVECOV_IO", ... ("LIVECOV_UNKNOWN" for other values). */
const char *livecov_status_name(int status);

/* The library's version, e.g. "0.1.0". */
const char *livecov_version(void);

#ifdef __cplusplus
}
#endif

#endif /* LIVECOV_H */
