/* launch.c — `ember launch --nproc N script.lua`: N ranks on this host.
 *
 * The launcher is a thin wrapper over Open MPI's mpirun, not a process
 * manager of its own: it runs `mpirun -np N ... ember run script.lua`, so the
 * ranks form the same MPI world as a user's own `mpirun`/`srun` line (which
 * keeps working, across hosts too). What it adds is what torchrun users
 * expect on one host: flags that work as root in a container and on few
 * cores, EMBER_* variables for every rank, and one line at the end naming the
 * rank that failed *first*.
 *
 * Why records and not only mpirun's report: when rank 1 raises, mpirun stops
 * the others with SIGTERM and reports the first *exit* it noticed, without
 * the Lua message. So each failing rank writes a record into EMBER_LAUNCH_DIR
 * (engine/launch_report.c) with a timestamp; the launcher names the earliest
 * record that is not "terminated", and falls back to the rank mpirun named
 * (a SIGKILL or os.exit leaves no record). mpirun's stderr comes through a
 * pipe so its framed abort messages can be read and replaced by that line;
 * every other line is forwarded as it arrives, any box it cannot read too.
 *
 * Why a Ctrl-C goes to the ranks and not to mpirun: Open MPI turns a SIGINT
 * (or SIGTERM) to mpirun into SIGTERM then SIGKILL for every rank, so a
 * training run died mid-step without its checkpoint. Each rank leaves its pid
 * in EMBER_LAUNCH_DIR (rank_env.c) and gets the SIGINT itself, as one process
 * under a terminal would; the ranks agree on the step to stop after
 * (ember.trainer) and exit on their own. */
#define _POSIX_C_SOURCE 200809L

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include "cli.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

#define PREFIX EMBER_PROGNAME " launch: "

/* Seconds between forwarding a stop to mpirun and killing it outright. */
#define STOP_GRACE_S 20

struct options {
	long nproc;
	const char *backend;     /* auto | nccl | mpi */
	const char *timeout;     /* seconds, as given; NULL when not given */
	const char *mpirun_args; /* extra mpirun flags, split on blanks */
	bool tag_output, dry_run, help;
	int script;              /* argv index of the script */
};

/* ---- signal names (also used by rank_env.c's handler: no allocation) ---- */

const char *cli_signal_name(int sig)
{
	switch (sig) {
	case SIGHUP: return "SIGHUP";
	case SIGINT: return "SIGINT";
	case SIGQUIT: return "SIGQUIT";
	case SIGILL: return "SIGILL";
	case SIGTRAP: return "SIGTRAP";
	case SIGABRT: return "SIGABRT";
	case SIGBUS: return "SIGBUS";
	case SIGFPE: return "SIGFPE";
	case SIGKILL: return "SIGKILL";
	case SIGUSR1: return "SIGUSR1";
	case SIGSEGV: return "SIGSEGV";
	case SIGUSR2: return "SIGUSR2";
	case SIGPIPE: return "SIGPIPE";
	case SIGALRM: return "SIGALRM";
	case SIGTERM: return "SIGTERM";
	case SIGXCPU: return "SIGXCPU";
	case SIGXFSZ: return "SIGXFSZ";
	case SIGSYS: return "SIGSYS";
	default: return "unknown signal";
	}
}

/* ---- help ---- */

static void print_help(FILE *f)
{
	fprintf(f,
	  "usage: ember launch --nproc N [options] SCRIPT [ARGS]\n"
	  "\n"
	  "Run SCRIPT on N ranks on this host (torchrun --nproc-per-node N). It runs\n"
	  "  mpirun -np N --oversubscribe --bind-to none ... <this ember> run SCRIPT ARGS\n"
	  "so the ranks form one MPI world; ember.dist uses NCCL for CUDA tensors and\n"
	  "MPI for CPU tensors. Every rank sees\n"
	  "  EMBER_RANK, EMBER_WORLD_SIZE, EMBER_LOCAL_RANK   (torchrun's RANK, WORLD_SIZE, LOCAL_RANK)\n"
	  "  EMBER_DIST_BACKEND    from --backend\n"
	  "  EMBER_DIST_TIMEOUT    from --timeout, when given\n"
	  "  EMBER_LAUNCH_DIR      where a failing rank leaves its failure record\n"
	  "\n"
	  "options:\n"
	  "  --nproc N             number of ranks (required), e.g. one per GPU\n"
	  "  --backend B           auto (default: NCCL for CUDA tensors, MPI for CPU), nccl or mpi\n"
	  "  --timeout SECONDS     a collective that waits longer ends the job (default: ember.dist's)\n"
	  "  --tag-output          prefix every output line with [jobid,rank]<stdout|stderr>\n"
	  "  --dry-run             print the mpirun command and environment, run nothing\n"
	  "  --mpirun-args \"...\"   more mpirun flags, after the launcher's own (quotes group words)\n"
	  "  -h, --help            print this help\n"
	  "  --                    stop handling options (for a script named like an option)\n"
	  "\n"
	  "When a rank fails, mpirun stops the others and the launcher prints one line\n"
	  "  ember launch: rank R (host H, pid P) failed first: <message>\n"
	  "with the rest of the message (a Lua traceback) indented below, and exits 1.\n"
	  "\"First\" is the earliest failure a rank recorded (a Lua error, a fatal signal,\n"
	  "a collective timeout), else the rank mpirun names (SIGKILL, os.exit(3)).\n"
	  "Status: 0 when every rank exits 0, 1 when one fails, 2 for a bad command line\n"
	  "or no mpirun, 130/143 after Ctrl-C/SIGTERM.\n"
	  "\n"
	  "Ctrl-C: the first one goes to every rank as SIGINT (mpirun is left alone), as\n"
	  "it would to one process: a script stops with the error \"interrupted!\", and\n"
	  "ember.trainer (scripts/train.lua) ends the step the ranks agree on, writes a\n"
	  "checkpoint, and every rank exits 0. A second Ctrl-C, a Ctrl-C before every rank\n"
	  "has started, SIGTERM and SIGHUP stop mpirun, which stops the ranks (SIGTERM),\n"
	  "and after %d s the launcher kills what is left.\n"
	  "\n"
	  "The launcher sets, for one host and for containers: --oversubscribe (more\n"
	  "ranks than cores), --bind-to none, OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 as root,\n"
	  "OMPI_MCA_btl_vader_single_copy_mechanism=none unless set (no CMA/ptrace in\n"
	  "containers), and stdin from /dev/null for the ranks.\n"
	  "\n"
	  "Several hosts: the launcher is for one host; use the process manager itself.\n"
	  "The ember executable derives EMBER_RANK & co from Open MPI, PMIx or Slurm:\n"
	  "  mpirun -np 16 --hostfile hosts -x EMBER_DIST_BACKEND ember run train.lua\n"
	  "      (hosts: one line per host, e.g. \"node1 slots=8\")\n"
	  "  srun --mpi=pmix -N 2 --ntasks-per-node 8 ember run train.lua\n"
	  "\n"
	  "examples:\n"
	  "  ember launch --nproc 2 scripts/bench_ddp.lua\n"
	  "  ember launch --nproc 8 --timeout 300 train.lua --steps 1000\n"
	  "  ember launch --nproc 4 --backend mpi --tag-output test.lua\n"
	  "  ember launch --nproc 2 --mpirun-args \"--mca btl tcp,self\" train.lua\n"
	  "  ember launch --nproc 2 --dry-run train.lua      show what would run\n"
	  "  mpirun -np 2 ember run train.lua                 the same world, by hand\n"
	  "\n"
	  "Needs Open MPI's mpirun on PATH (Debian/Ubuntu: openmpi-bin; make deps).\n",
	  STOP_GRACE_S);
}

static int usage(const char *fmt, const char *a, const char *b)
{
	fprintf(stderr, PREFIX);
	fprintf(stderr, fmt, a, b);
	fprintf(stderr, "\nTry 'ember launch --help' for more information.\n");
	return EXIT_USAGE;
}

/* ---- options ---- */

/* "--name VALUE" or "--name=VALUE": the value, advancing *i past it; NULL
 * when the argument is not this option. *missing is set when it is but the
 * value is absent. */
static const char *option_value(int argc, char **argv, int *i, const char *name, bool *missing)
{
	const char *a = argv[*i];
	size_t n = strlen(name);
	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] != '\0')
		return NULL;
	if (*i + 1 >= argc) {
		*missing = true;
		return NULL;
	}
	return argv[++*i];
}

static int check_nproc(const char *v, long *out)
{
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (v[0] == '\0' || *end != '\0' || errno != 0 || n < 1 || n > 100000)
		return usage("--nproc expects a positive integer (the number of ranks), got '%s'%s", v, "");
	*out = n;
	return EXIT_SUCCESS;
}

static int check_timeout(const char *v)
{
	char *end;
	errno = 0;
	double t = strtod(v, &end);
	if (v[0] == '\0' || *end != '\0' || errno != 0 || !(t > 0))
		return usage("--timeout expects a positive number of seconds, got '%s'%s", v, "");
	return EXIT_SUCCESS;
}

static int check_backend(const char *v)
{
	if (strcmp(v, "auto") == 0 || strcmp(v, "nccl") == 0 || strcmp(v, "mpi") == 0)
		return EXIT_SUCCESS;
	return usage("--backend expects auto, nccl or mpi, got '%s'%s", v, "");
}

/* One option at argv[*i]; returns EXIT_SUCCESS or a usage status. */
static int parse_option(int argc, char **argv, int *i, struct options *o)
{
	const char *a = argv[*i];
	bool missing = false;
	const char *v;
	if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)
		o->help = true;
	else if (strcmp(a, "--tag-output") == 0)
		o->tag_output = true;
	else if (strcmp(a, "--dry-run") == 0)
		o->dry_run = true;
	else if ((v = option_value(argc, argv, i, "--nproc", &missing)) != NULL)
		return check_nproc(v, &o->nproc);
	else if ((v = option_value(argc, argv, i, "--backend", &missing)) != NULL) {
		o->backend = v;
		return check_backend(v);
	} else if ((v = option_value(argc, argv, i, "--timeout", &missing)) != NULL) {
		o->timeout = v;
		return check_timeout(v);
	} else if ((v = option_value(argc, argv, i, "--mpirun-args", &missing)) != NULL)
		o->mpirun_args = v;
	else if (missing)
		return usage("option '%s' needs a value%s", a, "");
	else
		return usage("unknown option '%s' (expected --nproc, --backend, --timeout, "
		             "--tag-output, --dry-run, --mpirun-args or --help)%s", a, "");
	return EXIT_SUCCESS;
}

static int parse_options(int argc, char **argv, struct options *o)
{
	*o = (struct options){.backend = "auto"};
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			o->script = i + 1 < argc ? i + 1 : 0;
			break;
		}
		if (a[0] != '-' || a[1] == '\0') {
			o->script = i;
			break;
		}
		int status = parse_option(argc, argv, &i, o);
		if (status != EXIT_SUCCESS)
			return status;
	}
	if (o->help)
		return EXIT_SUCCESS;
	if (o->nproc == 0)
		return usage("--nproc N is required (the number of ranks), "
		             "e.g. ember launch --nproc 2 script.lua%s%s", "", "");
	if (o->script == 0)
		return usage("no script given (usage: ember launch --nproc N SCRIPT [ARGS])%s%s", "", "");
	const char *script = argv[o->script];
	if (strcmp(script, "-") == 0)
		return usage("the script cannot be stdin ('-'): the ranks read /dev/null%s%s", "", "");
	if (access(script, R_OK) != 0)
		return usage("cannot read script '%s': %s", script, strerror(errno));
	return EXIT_SUCCESS;
}

/* ---- the mpirun command line ---- */

struct strv {
	char **v;
	size_t n, cap;
};

static void push(struct strv *s, char *a)
{
	if (s->n + 1 < s->cap)
		s->v[s->n++] = a;
	s->v[s->n] = NULL;
}

/* Split `text` in place on blanks; '...' and "..." group words. */
static int split_words(char *text, struct strv *out)
{
	char *r = text, *w = text;
	while (*r != '\0') {
		while (*r == ' ' || *r == '\t' || *r == '\n')
			r++;
		if (*r == '\0')
			break;
		char *word = w;
		while (*r != '\0' && *r != ' ' && *r != '\t' && *r != '\n') {
			if (*r == '\'' || *r == '"') {
				char quote = *r++;
				while (*r != '\0' && *r != quote)
					*w++ = *r++;
				if (*r != quote)
					return usage("--mpirun-args: unterminated %s quote%s",
					             quote == '"' ? "double" : "single", "");
				r++;
			} else
				*w++ = *r++;
		}
		bool at_end = *r == '\0';
		*w++ = '\0';
		if (!at_end)
			r++;
		push(out, word);
		if (at_end)
			break;
	}
	return EXIT_SUCCESS;
}

/* The first executable `name` on PATH, into out. */
static bool find_on_path(const char *name, char *out, size_t cap)
{
	const char *path = getenv("PATH");
	if (path == NULL)
		path = "/usr/local/bin:/usr/bin:/bin";
	while (*path != '\0') {
		const char *colon = strchr(path, ':');
		size_t len = colon ? (size_t)(colon - path) : strlen(path);
		int n = snprintf(out, cap, "%.*s/%s", (int)len, len ? path : ".", name);
		if (n > 0 && (size_t)n < cap && access(out, X_OK) == 0)
			return true;
		path += len + (colon ? 1 : 0);
	}
	return false;
}

struct plan {
	char mpirun[PATH_MAX];
	char exe[PATH_MAX];
	char np[24];
	long nproc;
	char dir[PATH_MAX];  /* EMBER_LAUNCH_DIR; empty until created */
	char *extra;         /* the copy of --mpirun-args split in place */
	struct strv argv;
};

/* mpirun FLAGS EXE run SCRIPT ARGS: the launcher's flags first, the user's
 * after them, so theirs can add to or override ours. */
static int build_argv(struct plan *p, const struct options *o, int argc, char **argv)
{
	size_t words = o->mpirun_args ? strlen(o->mpirun_args) / 2 + 1 : 0;
	p->argv.cap = 32 + words + (size_t)argc;
	p->argv.v = calloc(p->argv.cap, sizeof(char *));
	if (p->argv.v == NULL)
		return EXIT_FAILURE;
	snprintf(p->np, sizeof p->np, "%ld", o->nproc);
	p->nproc = o->nproc;
	char *fixed[] = {p->mpirun, "-np", p->np, "--oversubscribe", "--bind-to", "none",
	                 "-x", "EMBER_DIST_BACKEND", "-x", "EMBER_LAUNCH_DIR"};
	for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
		push(&p->argv, fixed[i]);
	if (getenv("EMBER_DIST_TIMEOUT") != NULL || o->timeout != NULL) {
		push(&p->argv, "-x");
		push(&p->argv, "EMBER_DIST_TIMEOUT");
	}
	if (o->tag_output)
		push(&p->argv, "--tag-output");
	if (o->mpirun_args != NULL) {
		p->extra = strdup(o->mpirun_args);
		if (p->extra == NULL)
			return EXIT_FAILURE;
		int status = split_words(p->extra, &p->argv);
		if (status != EXIT_SUCCESS)
			return status;
	}
	push(&p->argv, p->exe);
	push(&p->argv, "run");
	if (argv[o->script][0] == '-')
		push(&p->argv, "--");
	for (int i = o->script; i < argc; i++)
		push(&p->argv, argv[i]);
	return EXIT_SUCCESS;
}

static void free_plan(struct plan *p)
{
	free(p->argv.v);
	free(p->extra);
}

/* ---- environment ---- */

struct envvar {
	const char *name, *value;
	bool keep_user; /* a value the user already set wins */
};

/* What mpirun and the ranks get; dir is EMBER_LAUNCH_DIR's value. */
static size_t launch_env(const struct options *o, const char *dir, struct envvar *out)
{
	size_t n = 0;
	out[n++] = (struct envvar){"EMBER_DIST_BACKEND", o->backend, false};
	if (o->timeout != NULL)
		out[n++] = (struct envvar){"EMBER_DIST_TIMEOUT", o->timeout, false};
	out[n++] = (struct envvar){"EMBER_LAUNCH_DIR", dir, false};
	out[n++] = (struct envvar){"OMPI_MCA_btl_vader_single_copy_mechanism", "none", true};
	if (getuid() == 0) {
		out[n++] = (struct envvar){"OMPI_ALLOW_RUN_AS_ROOT", "1", false};
		out[n++] = (struct envvar){"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", false};
	}
	return n;
}

static void apply_env(const struct envvar *env, size_t n)
{
	/* a fresh world: ranks derive these from mpirun's variables */
	unsetenv("EMBER_RANK");
	unsetenv("EMBER_WORLD_SIZE");
	unsetenv("EMBER_LOCAL_RANK");
	for (size_t i = 0; i < n; i++)
		setenv(env[i].name, env[i].value, !env[i].keep_user);
}

/* ---- dry run ---- */

static void print_quoted(FILE *f, const char *s)
{
	bool plain = s[0] != '\0';
	for (const char *c = s; *c != '\0'; c++)
		if (!isalnum((unsigned char)*c) && strchr("-_./=:,+@%", *c) == NULL)
			plain = false;
	if (plain) {
		fputs(s, f);
		return;
	}
	fputc('\'', f);
	for (const char *c = s; *c != '\0'; c++) {
		if (*c == '\'')
			fputs("'\\''", f);
		else
			fputc(*c, f);
	}
	fputc('\'', f);
}

static void print_dry_run(const struct plan *p, const struct envvar *env, size_t n)
{
	printf("environment:\n");
	for (size_t i = 0; i < n; i++) {
		const char *user = env[i].keep_user ? getenv(env[i].name) : NULL;
		printf("  %s=%s%s\n", env[i].name, user ? user : env[i].value,
		       user ? " (yours, kept)" : "");
	}
	printf("  (EMBER_RANK, EMBER_WORLD_SIZE, EMBER_LOCAL_RANK unset: each rank derives its own)\n");
	printf("command:\n  ");
	for (size_t i = 0; i < p->argv.n; i++) {
		if (i > 0)
			putchar(' ');
		print_quoted(stdout, p->argv.v[i]);
	}
	printf(" </dev/null\n");
}

/* ---- what mpirun reports (its framed messages on stderr) ---- */

struct mpi_report {
	int rank;        /* -1: none named */
	int signal;      /* 0: none */
	int exit_code;   /* -1: unknown */
	long pid;        /* 0: unknown (Open MPI 4 often says PID 0) */
	bool abort;      /* MPI_Abort */
	bool improper;   /* exited without MPI_Finalize, no status given */
	char host[128];
};

/* Newlines and runs of blanks become one space: messages wrap anywhere. */
static void flatten(const char *in, char *out, size_t cap)
{
	size_t n = 0;
	bool blank = false;
	for (; *in != '\0' && n + 1 < cap; in++) {
		if (isspace((unsigned char)*in)) {
			blank = n > 0;
			continue;
		}
		if (blank && n + 2 < cap)
			out[n++] = ' ';
		blank = false;
		out[n++] = *in;
	}
	out[n] = '\0';
}

static bool scan_int(const char *text, const char *after, int *out)
{
	const char *p = strstr(text, after);
	return p != NULL && sscanf(p + strlen(after), "%d", out) == 1;
}

/* "Process name: [[8489,1],1]" (Open MPI 4) or "[prterun-vm-12@1,1]" (5):
 * the rank is the last number inside the brackets. */
static bool scan_process_name(const char *text, int *rank)
{
	const char *p = strstr(text, "Process name:");
	if (p == NULL || (p = strchr(p, '[')) == NULL)
		return false;
	const char *end = strchr(p, ' ');
	if (end == NULL)
		end = p + strlen(p);
	const char *last = NULL;
	for (const char *c = p; c < end; c++)
		if (isdigit((unsigned char)*c) && !isdigit((unsigned char)c[-1]))
			last = c;
	return last != NULL && sscanf(last, "%d", rank) == 1;
}

/* "process rank 1 with PID 12 on node vm exited on signal 9 (Killed)" and
 * "... exiting improperly": Open MPI 4's mpirun and 5's prterun alike. */
static bool scan_process_rank(const char *text, struct mpi_report *r)
{
	const char *p = strstr(text, "process rank ");
	if (p == NULL || sscanf(p, "process rank %d", &r->rank) != 1)
		return false;
	const char *q = strstr(p, "with PID ");
	if (q != NULL)
		sscanf(q, "with PID %ld", &r->pid);
	if ((q = strstr(p, "on node ")) != NULL)
		sscanf(q, "on node %127s", r->host);
	size_t h = strlen(r->host);
	if (h > 0 && (r->host[h - 1] == '.' || r->host[h - 1] == ','))
		r->host[h - 1] = '\0';
	if (!scan_int(p, "signal ", &r->signal))
		r->improper = strstr(p, "improperly") != NULL;
	return true;
}

/* Reads one box; true when it is an abort notice the summary replaces. */
static bool parse_box(const char *box, struct mpi_report *r)
{
	static char text[16384];
	flatten(box, text, sizeof text);
	*r = (struct mpi_report){.rank = -1, .exit_code = -1};
	if (strstr(text, "MPI_ABORT was invoked on rank ") != NULL) {
		r->abort = true;
		scan_int(text, "with errorcode ", &r->exit_code);
		return scan_int(text, "MPI_ABORT was invoked on rank ", &r->rank);
	}
	if (strstr(text, "Process name:") != NULL) {
		if (!scan_int(text, "Exit code: ", &r->exit_code) || !scan_process_name(text, &r->rank))
			return false;
		const char *h = strstr(text, "Local host: ");
		if (h != NULL)
			sscanf(h, "Local host: %127s", r->host);
		return true;
	}
	if (strstr(text, "process rank ") != NULL)
		return scan_process_rank(text, r);
	/* the preamble without a rank: "Primary job terminated normally, but 1
	 * process returned a non-zero exit code ... the job has been aborted" */
	return strstr(text, "terminated normally, but") != NULL ||
	       strstr(text, "job has been aborted") != NULL;
}

/* The first report names the rank; later ones about it fill in details. */
static void merge_report(struct mpi_report *into, const struct mpi_report *r)
{
	if (r->rank < 0)
		return;
	if (into->rank < 0) {
		*into = *r;
		return;
	}
	if (into->rank != r->rank)
		return;
	if (into->signal == 0)
		into->signal = r->signal;
	if (into->exit_code < 0)
		into->exit_code = r->exit_code;
	if (into->pid == 0)
		into->pid = r->pid;
	if (into->host[0] == '\0')
		memcpy(into->host, r->host, sizeof into->host);
	into->abort |= r->abort;
	into->improper |= r->improper;
}

/* ---- mpirun's stderr, line by line ---- */

#define BOX_MAX_LINES 80

struct reader {
	char buf[1 << 16];
	size_t len;
	bool partial_sent;   /* the start of the current line went out already */
	char *box;           /* the open box's lines, NULL when none is open */
	size_t box_len, box_lines;
	struct mpi_report report;
};

static bool is_rule(const char *line, size_t n)
{
	while (n > 0 && (line[n - 1] == '\r' || line[n - 1] == ' '))
		n--;
	if (n < 40)
		return false;
	for (size_t i = 0; i < n; i++)
		if (line[i] != '-')
			return false;
	return true;
}

static void box_append(struct reader *r, const char *line, size_t n)
{
	char *grown = realloc(r->box, r->box_len + n + 2);
	if (grown == NULL)
		return;
	r->box = grown;
	memcpy(r->box + r->box_len, line, n);
	r->box_len += n;
	r->box[r->box_len++] = '\n';
	r->box[r->box_len] = '\0';
	r->box_lines++;
}

/* Forward the open box as it came (not an abort notice, or never closed). */
static void box_flush(struct reader *r)
{
	if (r->box != NULL)
		fwrite(r->box, 1, r->box_len, stderr);
	free(r->box);
	r->box = NULL;
	r->box_len = r->box_lines = 0;
}

static void box_close(struct reader *r)
{
	struct mpi_report one;
	if (parse_box(r->box, &one)) {
		merge_report(&r->report, &one);
		free(r->box);
		r->box = NULL;
		r->box_len = r->box_lines = 0;
	} else
		box_flush(r);
}

static void on_line(struct reader *r, const char *line, size_t n)
{
	bool rule = !r->partial_sent && is_rule(line, n);
	r->partial_sent = false;
	if (r->box == NULL && !rule) {
		fwrite(line, 1, n, stderr);
		fputc('\n', stderr);
		return;
	}
	bool opening = r->box == NULL;
	box_append(r, line, n);
	if (rule && !opening)
		box_close(r);
	else if (r->box_lines > BOX_MAX_LINES)
		box_flush(r);
}

static void on_data(struct reader *r, const char *data, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (r->len == sizeof r->buf) { /* a line this long: pass it on in pieces */
			if (r->box != NULL)
				on_line(r, r->buf, r->len);
			else {
				fwrite(r->buf, 1, r->len, stderr);
				r->partial_sent = true;
			}
			r->len = 0;
		}
		if (data[i] == '\n') {
			on_line(r, r->buf, r->len);
			r->len = 0;
		} else
			r->buf[r->len++] = data[i];
	}
}

/* Quiet for a moment: a line without its newline yet (a progress meter)
 * goes out now, unless it is inside a box or may be a box's rule. */
static void on_idle(struct reader *r)
{
	if (r->box != NULL || r->len == 0 || r->buf[0] == '-')
		return;
	fwrite(r->buf, 1, r->len, stderr);
	r->len = 0;
	r->partial_sent = true;
}

static void on_eof(struct reader *r)
{
	if (r->len > 0)
		on_line(r, r->buf, r->len);
	r->len = 0;
	box_flush(r);
}

/* ---- failure records (see ember/launch.h) ---- */

struct record {
	unsigned long long time_ns;
	int rank;
	long pid;
	char host[128];
	char kind[32];
	char *message; /* malloc'd, may be empty */
};

/* dir/name into out; false when it does not fit. */
static bool join_path(char *out, size_t cap, const char *dir, const char *name)
{
	int n = snprintf(out, cap, "%s/%s", dir, name);
	return n > 0 && (size_t)n < cap;
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (f == NULL)
		return NULL;
	size_t cap = 1 << 20; /* a traceback is small; more is not worth printing */
	char *text = malloc(cap + 1);
	size_t n = text ? fread(text, 1, cap, f) : 0;
	fclose(f);
	if (text != NULL)
		text[n] = '\0';
	return text;
}

static bool parse_record(char *text, struct record *rec)
{
	char *nl = strchr(text, '\n');
	if (nl != NULL)
		*nl = '\0';
	if (sscanf(text, "%llu %d %127s %ld %31s", &rec->time_ns, &rec->rank, rec->host,
	           &rec->pid, rec->kind) != 5)
		return false;
	rec->message = strdup(nl ? nl + 1 : "");
	return rec->message != NULL;
}

/* The earliest record that is not "terminated"; false when there is none. */
static bool first_record(const char *dir, struct record *best)
{
	DIR *d = opendir(dir);
	if (d == NULL)
		return false;
	bool found = false;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);
		if (e->d_name[0] == '.' || n < 6 || strcmp(e->d_name + n - 5, ".fail") != 0)
			continue;
		char path[PATH_MAX];
		if (!join_path(path, sizeof path, dir, e->d_name))
			continue;
		char *text = read_file(path);
		struct record rec = {0};
		bool ok = text != NULL && parse_record(text, &rec);
		free(text);
		if (!ok)
			continue;
		bool earlier = !found || rec.time_ns < best->time_ns ||
		               (rec.time_ns == best->time_ns && rec.rank < best->rank);
		if (strcmp(rec.kind, "terminated") == 0 || !earlier) {
			free(rec.message);
			continue;
		}
		if (found)
			free(best->message);
		*best = rec;
		found = true;
	}
	closedir(d);
	return found;
}

static void remove_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (d != NULL) {
		struct dirent *e;
		while ((e = readdir(d)) != NULL) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			char path[PATH_MAX];
			if (join_path(path, sizeof path, dir, e->d_name))
				unlink(path);
		}
		closedir(d);
	}
	rmdir(dir);
}

/* ---- the summary ---- */

/* "rank 1 (host vm, pid 12)", leaving out what is unknown. */
static void print_who(int rank, const char *host, long pid)
{
	fprintf(stderr, PREFIX "rank %d", rank);
	if (host[0] != '\0' && pid > 0)
		fprintf(stderr, " (host %s, pid %ld)", host, pid);
	else if (host[0] != '\0')
		fprintf(stderr, " (host %s)", host);
	else if (pid > 0)
		fprintf(stderr, " (pid %ld)", pid);
}

static void print_mpi_cause(FILE *f, const struct mpi_report *r)
{
	if (r->signal > 0)
		fprintf(f, "killed by signal %d (%s)", r->signal, cli_signal_name(r->signal));
	else if (r->abort)
		fprintf(f, "MPI_Abort with error code %d", r->exit_code);
	else if (r->exit_code >= 0)
		fprintf(f, "exit status %d", r->exit_code);
	else if (r->improper)
		fprintf(f, "exited without finalizing MPI (status unknown)");
	else
		fprintf(f, "failed (mpirun gave no status)");
}

/* The message's first line on the summary line, the rest indented below. */
static void print_message(const char *msg)
{
	size_t n = strlen(msg);
	while (n > 0 && msg[n - 1] == '\n')
		n--;
	const char *end = msg + n;
	const char *nl = memchr(msg, '\n', n);
	fprintf(stderr, "%.*s\n", (int)((nl ? nl : end) - msg), msg);
	for (const char *line = nl; line != NULL && line < end;) {
		line++;
		const char *next = memchr(line, '\n', (size_t)(end - line));
		fprintf(stderr, "  %.*s\n", (int)((next ? next : end) - line), line);
		line = next;
	}
}

static void summarize(const char *dir, const struct mpi_report *mpi, int wstatus)
{
	struct record rec;
	if (dir[0] != '\0' && first_record(dir, &rec)) {
		print_who(rec.rank, rec.host, rec.pid);
		fprintf(stderr, " failed first: ");
		print_message(rec.message[0] != '\0' ? rec.message : rec.kind);
		if (mpi->rank >= 0 && mpi->rank != rec.rank) {
			fprintf(stderr, "  (mpirun noticed rank %d first: ", mpi->rank);
			print_mpi_cause(stderr, mpi);
			fprintf(stderr, ")\n");
		}
		free(rec.message);
	} else if (mpi->rank >= 0) {
		print_who(mpi->rank, mpi->host, mpi->pid);
		fprintf(stderr, " failed first: ");
		print_mpi_cause(stderr, mpi);
		fputc('\n', stderr);
	} else if (WIFSIGNALED(wstatus))
		fprintf(stderr, PREFIX "mpirun was killed by signal %d (%s) and named no failed rank\n",
		        WTERMSIG(wstatus), cli_signal_name(WTERMSIG(wstatus)));
	else
		fprintf(stderr, PREFIX "mpirun failed with exit status %d and named no failed rank "
		        "(see its output above)\n", WEXITSTATUS(wstatus));
}

/* ---- running mpirun ---- */

static volatile sig_atomic_t stop_signal; /* the first one */
static volatile sig_atomic_t stop_count;

static void on_stop(int sig)
{
	if (stop_signal == 0)
		stop_signal = sig;
	stop_count++;
}

static void catch_stops(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_stop;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGHUP, &sa, NULL);
}

/* In the child: stdin from /dev/null, stderr into the pipe, its own process
 * group (a terminal's Ctrl-C reaches the launcher only, which stops mpirun
 * once, cleanly), and gone if the launcher dies. Never returns. */
static void exec_mpirun(const struct plan *p, int err_w)
{
	setpgid(0, 0);
#ifdef __linux__
	prctl(PR_SET_PDEATHSIG, SIGTERM);
#endif
	int null = open("/dev/null", O_RDONLY);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		close(null);
	}
	dup2(err_w, STDERR_FILENO);
	close(err_w);
	execv(p->mpirun, p->argv.v);
	dprintf(STDERR_FILENO, PREFIX "cannot run %s: %s\n", p->mpirun, strerror(errno));
	_exit(127);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A rank's pid from dir/rank<R>.pid (rank_env.c), 0 when absent or odd. */
static pid_t rank_pid(const char *dir, long rank)
{
	char path[PATH_MAX], name[32];
	snprintf(name, sizeof name, "rank%ld.pid", rank);
	if (!join_path(path, sizeof path, dir, name))
		return 0;
	char *text = read_file(path);
	if (text == NULL)
		return 0;
	char *end;
	long pid = strtol(text, &end, 10);
	bool ok = end != text && *end == '\n' && pid > 1;
	free(text);
	return ok ? (pid_t)pid : 0;
}

/* Ctrl-C, the first: SIGINT to every rank, which ends a script at its next
 * Lua instruction, or a training loop after the step the ranks agree on
 * (trainer.lua), checkpoint written. mpirun itself stays untouched: Open MPI
 * turns a SIGINT or SIGTERM to mpirun into SIGTERM then SIGKILL for the
 * ranks. False when some rank has not registered yet (still starting:
 * nothing to save), and then the caller stops mpirun instead. */
static bool ask_ranks(const char *dir, long nproc)
{
	if (dir[0] == '\0')
		return false;
	pid_t *pids = calloc((size_t)nproc, sizeof *pids);
	if (pids == NULL)
		return false;
	bool all = true;
	for (long r = 0; r < nproc && all; r++)
		all = (pids[r] = rank_pid(dir, r)) != 0;
	for (long r = 0; r < nproc && all; r++)
		kill(pids[r], SIGINT);
	free(pids);
	return all;
}

struct stopper {
	const char *dir;
	long nproc;
	int handled;    /* stop_count acted on */
	bool asked;     /* the ranks got the SIGINT and mpirun was left alone */
	double term_at; /* when mpirun got SIGTERM; 0 before */
};

/* A first Ctrl-C asks the ranks (ask_ranks); a second one, or SIGTERM/HUP,
 * sends one SIGTERM to mpirun (it stops the ranks), and SIGKILL goes to its
 * group if it is still there after the grace period. */
static void forward_stop(pid_t pid, struct stopper *s)
{
	int count = stop_count;
	if (count == s->handled && s->term_at == 0)
		return;
	if (count > s->handled && s->term_at == 0) {
		bool first = s->handled == 0;
		s->handled = count;
		if (first && count == 1 && stop_signal == SIGINT && ask_ranks(s->dir, s->nproc)) {
			s->asked = true;
			fprintf(stderr, PREFIX "SIGINT: asked the ranks to stop (a training run ends its "
			        "step and writes a checkpoint); Ctrl-C again to kill them\n");
			return;
		}
		if (s->asked)
			fprintf(stderr, PREFIX "second stop signal: stopping mpirun and the ranks\n");
		s->term_at = now_s();
		kill(pid, SIGTERM);
	} else if (s->term_at != 0 && now_s() - s->term_at > STOP_GRACE_S) {
		kill(-pid, SIGKILL);
		kill(pid, SIGKILL);
	}
}

/* Forward mpirun's stderr until it exits; returns its wait status. After
 * the exit, what is still in the pipe is read until EOF or a quiet second
 * (a stray grandchild may hold the pipe open). */
static int pump(pid_t pid, int err_r, struct reader *rd, struct stopper *stop)
{
	int wstatus = 0;
	bool exited = false, eof = false;
	double exited_at = 0;
	char chunk[8192];
	while (!eof && !(exited && now_s() - exited_at > 1.0)) {
		forward_stop(pid, stop);
		struct pollfd pfd = {.fd = err_r, .events = POLLIN};
		int ready = poll(&pfd, 1, 200);
		if (ready > 0) {
			ssize_t n = read(err_r, chunk, sizeof chunk);
			if (n > 0)
				on_data(rd, chunk, (size_t)n);
			else if (n == 0 || errno != EINTR)
				eof = true;
		} else if (ready == 0)
			on_idle(rd);
		if (!exited && waitpid(pid, &wstatus, WNOHANG) == pid) {
			exited = true;
			exited_at = now_s();
		}
	}
	on_eof(rd);
	while (!exited) {
		forward_stop(pid, stop);
		pid_t w = waitpid(pid, &wstatus, 0);
		exited = w == pid || (w < 0 && errno != EINTR);
	}
	return wstatus;
}

static int run_mpirun(const struct plan *p, struct reader *rd, int *wstatus, bool *asked)
{
	int fds[2];
	if (pipe(fds) != 0) {
		fprintf(stderr, PREFIX "cannot create a pipe: %s\n", strerror(errno));
		return EXIT_FAILURE;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, PREFIX "cannot fork: %s\n", strerror(errno));
		close(fds[0]);
		close(fds[1]);
		return EXIT_FAILURE;
	}
	if (pid == 0) {
		close(fds[0]);
		exec_mpirun(p, fds[1]);
	}
	close(fds[1]);
	struct stopper stop = {.dir = p->dir, .nproc = p->nproc};
	*wstatus = pump(pid, fds[0], rd, &stop);
	*asked = stop.asked && stop.term_at == 0;
	close(fds[0]);
	return EXIT_SUCCESS;
}

/* Status of the launcher from mpirun's, after the summary if it failed. */
static int finish(const struct plan *p, const struct reader *rd, int wstatus, bool asked)
{
	struct record rec;
	if (asked) {
		/* the ranks ended on their own after the SIGINT; a Lua error other
		 * than "interrupted!" on the way out is still worth naming */
		if (first_record(p->dir, &rec)) {
			free(rec.message);
			summarize(p->dir, &rd->report, wstatus);
		}
		if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
			fprintf(stderr, PREFIX "stopped by SIGINT; every rank stopped on its own and exited 0\n");
		else
			fprintf(stderr, PREFIX "stopped by SIGINT; the ranks were interrupted (mpirun stops "
			        "the others when one exits non-zero)\n");
		return 128 + SIGINT;
	}
	if (stop_signal != 0) {
		fprintf(stderr, PREFIX "stopped by %s; mpirun and the ranks were stopped\n",
		        cli_signal_name(stop_signal));
		return 128 + stop_signal;
	}
	if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
		return EXIT_SUCCESS;
	summarize(p->dir, &rd->report, wstatus);
	return EXIT_FAILURE;
}

static bool make_dir(char *out, size_t cap)
{
	const char *tmp = getenv("TMPDIR");
	if (tmp == NULL || tmp[0] == '\0')
		tmp = "/tmp";
	int n = snprintf(out, cap, "%s/ember-launch-XXXXXX", tmp);
	if (n < 0 || (size_t)n >= cap || mkdtemp(out) == NULL) {
		fprintf(stderr, PREFIX "cannot create a directory in %s for failure records: %s\n",
		        tmp, strerror(errno));
		out[0] = '\0';
		return false;
	}
	return true;
}

static int prepare(struct plan *p, const struct options *o, int argc, char **argv)
{
	if (!find_on_path("mpirun", p->mpirun, sizeof p->mpirun)) {
		fprintf(stderr, PREFIX "mpirun not found: install openmpi-bin (make deps)\n");
		return EXIT_USAGE;
	}
	ssize_t n = readlink("/proc/self/exe", p->exe, sizeof p->exe - 1);
	if (n <= 0) {
		fprintf(stderr, PREFIX "cannot find this executable (/proc/self/exe): %s\n",
		        strerror(errno));
		return EXIT_FAILURE;
	}
	p->exe[n] = '\0';
	return build_argv(p, o, argc, argv);
}

static int launch(const struct options *o, int argc, char **argv)
{
	struct plan p = {0};
	struct envvar env[8];
	int status = prepare(&p, o, argc, argv);
	if (status == EXIT_SUCCESS && o->dry_run) {
		size_t n = launch_env(o, "(a fresh temporary directory, removed at exit)", env);
		print_dry_run(&p, env, n);
	} else if (status == EXIT_SUCCESS && make_dir(p.dir, sizeof p.dir)) {
		apply_env(env, launch_env(o, p.dir, env));
		catch_stops();
		struct reader *rd = calloc(1, sizeof *rd);
		int wstatus = 0;
		status = EXIT_FAILURE;
		if (rd != NULL) {
			rd->report = (struct mpi_report){.rank = -1, .exit_code = -1};
			bool asked = false;
			if (run_mpirun(&p, rd, &wstatus, &asked) == EXIT_SUCCESS)
				status = finish(&p, rd, wstatus, asked);
			free(rd);
		}
		remove_dir(p.dir);
	} else if (status == EXIT_SUCCESS)
		status = EXIT_FAILURE;
	free_plan(&p);
	return status;
}

int cli_launch(int argc, char **argv)
{
	struct options o;
	int status = parse_options(argc, argv, &o);
	if (status != EXIT_SUCCESS)
		return status;
	if (o.help) {
		print_help(stdout);
		return EXIT_SUCCESS;
	}
	return launch(&o, argc, argv);
}
