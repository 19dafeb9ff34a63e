/* rank_env.c — what a rank does at start, before any Lua runs.
 *
 * Scripts read EMBER_RANK / EMBER_WORLD_SIZE / EMBER_LOCAL_RANK (torchrun's
 * RANK / WORLD_SIZE / LOCAL_RANK). Nobody sets those for `mpirun -np 2 ember
 * run x.lua` or `srun ember run x.lua`, so the executable derives them from
 * the process manager's own variables: Open MPI's OMPI_COMM_WORLD_*, PMIx's
 * PMIX_RANK, Slurm's SLURM_*. An EMBER_RANK already set wins (a user or
 * another launcher chose it), which is why `ember launch` clears it.
 *
 * Under `ember launch` (EMBER_LAUNCH_DIR set) fatal signals also leave a
 * failure record, so the launcher can say "rank 1 ... killed by signal 11
 * (SIGSEGV)" with the host and pid, then the signal ends the process as it
 * would have. SIGTERM is left alone: that is mpirun stopping the survivors.
 *
 * Each rank also leaves its pid there (rank<R>.pid): the launcher passes a
 * Ctrl-C on to the ranks themselves, not to mpirun, whose SIGINT/SIGTERM
 * would kill them mid-step (Open MPI forwards neither), so that a training
 * loop can finish its step and write a checkpoint (docs/training.md). */
#define _XOPEN_SOURCE 700 /* sigaltstack, SA_ONSTACK */

#include <signal.h>
#include <stdio.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "ember/launch.h"

/* ---- EMBER_RANK and friends ---- */

struct source {
	const char *rank, *size, *local;
};

/* First match wins. PMIx sets no size or local rank of its own; under srun
 * Slurm's variables give them. */
static const struct source sources[] = {
	{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
	{"PMIX_RANK", "SLURM_NTASKS", "SLURM_LOCALID"},
	{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

static void copy_env(const char *to, const char *from)
{
	const char *v = getenv(from);
	if (v != NULL && v[0] != '\0')
		setenv(to, v, 0);
}

void cli_rank_env(void)
{
	if (getenv("EMBER_RANK") != NULL)
		return;
	for (size_t i = 0; i < sizeof sources / sizeof sources[0]; i++) {
		const char *rank = getenv(sources[i].rank);
		if (rank == NULL || rank[0] == '\0')
			continue;
		setenv("EMBER_RANK", rank, 1);
		copy_env("EMBER_WORLD_SIZE", sources[i].size);
		copy_env("EMBER_LOCAL_RANK", sources[i].local);
		return;
	}
}

/* ---- fatal signals under the launcher ---- */

static void append(char *out, size_t cap, size_t *len, const char *s)
{
	while (*s != '\0' && *len + 1 < cap)
		out[(*len)++] = *s++;
	out[*len] = '\0';
}

/* "killed by signal 11 (SIGSEGV)", built without snprintf (signal handler). */
static void signal_message(char *out, size_t cap, int sig)
{
	char digits[12];
	int n = (int)sizeof digits - 1;
	digits[n] = '\0';
	for (int v = sig; n == (int)sizeof digits - 1 || v > 0; v /= 10)
		digits[--n] = (char)('0' + v % 10);
	size_t len = 0;
	out[0] = '\0';
	append(out, cap, &len, "killed by signal ");
	append(out, cap, &len, digits + n);
	append(out, cap, &len, " (");
	append(out, cap, &len, cli_signal_name(sig));
	append(out, cap, &len, ")");
}

static void on_fatal_signal(int sig)
{
	char msg[64];
	signal_message(msg, sizeof msg, sig);
	em_launch_report_failure_async("signal", msg);
	/* SA_RESETHAND restored the default action: this ends the process with
	 * the same signal, so mpirun and shells see what really happened */
	raise(sig);
}

/* A stack overflow is a SIGSEGV with no stack left to run the handler on. */
static void use_alternate_stack(void)
{
	static char stack[64 * 1024];
	stack_t ss = {.ss_sp = stack, .ss_size = sizeof stack, .ss_flags = 0};
	sigaltstack(&ss, NULL);
}

void cli_rank_fatal_signals(void)
{
	if (!em_launch_report_prepare())
		return;
	use_alternate_stack();
	static const int fatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_fatal_signal;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = SA_RESETHAND | SA_NODEFER | SA_ONSTACK;
	for (size_t i = 0; i < sizeof fatal / sizeof fatal[0]; i++)
		sigaction(fatal[i], &sa, NULL);
}

/* ---- the pid file the launcher signals through ---- */

static char pid_path[4096]; /* set once this process's pid is in it */

/* At exit the file goes, so a late Ctrl-C never reaches a reused pid. */
static void unregister(void)
{
	unlink(pid_path);
}

void cli_rank_register(void)
{
	const char *dir = getenv("EMBER_LAUNCH_DIR");
	const char *rank = getenv("EMBER_RANK");
	if (dir == NULL || dir[0] == '\0' || rank == NULL || rank[0] == '\0')
		return;
	char tmp[4096], path[sizeof pid_path];
	int a = snprintf(tmp, sizeof tmp, "%s/.rank%s.%ld.tmp", dir, rank, (long)getpid());
	int b = snprintf(path, sizeof path, "%s/rank%s.pid", dir, rank);
	if (a < 0 || (size_t)a >= sizeof tmp || b < 0 || (size_t)b >= sizeof path)
		return;
	FILE *f = fopen(tmp, "w");
	if (f == NULL)
		return; /* then a Ctrl-C stops mpirun as before: no worse */
	bool ok = fprintf(f, "%ld\n", (long)getpid()) > 0;
	ok = fclose(f) == 0 && ok;
	/* linked into place whole, so the launcher never reads half a number;
	 * link() does not replace: an `ember` the rank's script starts itself
	 * inherits the variables, and the rank's own pid must stay */
	if (ok && link(tmp, path) == 0) {
		memcpy(pid_path, path, sizeof pid_path);
		atexit(unregister);
	}
	remove(tmp);
}
