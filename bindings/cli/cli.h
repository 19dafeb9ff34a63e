/* cli.h — what the pieces of the `ember` executable share.
 *
 * The executable is lua.c (Lua 5.4's stand-alone interpreter) re-cut for
 * Ember: ember_main.c parses the command line and dispatches subcommands,
 * cli_state.c prepares a lua_State (libraries, the statically linked
 * ember.core, package.path, LUA_INIT) and runs chunks under a traceback
 * handler and a SIGINT hook, repl.c is the interactive prompt, launch.c is
 * `ember launch` (mpirun underneath) and rank_env.c what every rank does
 * at start (EMBER_RANK, fatal-signal records). They are
 * separate so each stays short enough to read in one sitting. */
#ifndef EMBER_CLI_H
#define EMBER_CLI_H

#include <stdbool.h>

#include <lua.h>

#define EMBER_PROGNAME "ember"

#ifndef EMBER_VERSION_STR
#define EMBER_VERSION_STR "0.0.0-dev"
#endif

/* Exit statuses: 1 for a failed script, 2 for a command line we refuse. */
#define EXIT_USAGE 2

/* ---- cli_state.c ---- */

/* Open the standard libraries, preload ember.core, put the ember package
 * first on package.path. noenv: ignore LUA_PATH/LUA_CPATH (option -E). */
void cli_open(lua_State *L, bool noenv);

/* Run LUA_INIT_5_4 / LUA_INIT like lua.c; returns a Lua status. */
int cli_luainit(lua_State *L);

/* Call the function below `narg` arguments on the stack with a traceback
 * message handler and Ctrl-C turned into the Lua error "interrupted!".
 * Leaves `nres` results (LUA_MULTRET allowed) or the error message. */
int cli_docall(lua_State *L, int narg, int nres);

/* If status is an error, print "ember: <message>" to stderr (no prefix when
 * prefix is false) and pop it. Returns status unchanged. */
int cli_report(lua_State *L, int status, bool prefix);

/* SIGINT handling outside of cli_docall: while reading a line, Ctrl-C only
 * sets a flag and interrupts the read (no SA_RESTART). */
void cli_sigint_for_input(void);
void cli_sigint_default(void);
/* True (and clears the flag) if Ctrl-C arrived since the last call. */
bool cli_take_sigint(void);

/* "ember 0.1.0 (Lua 5.4.x, CUDA on|off)" without a newline. */
const char *cli_version_string(void);

/* ---- repl.c ---- */

/* Read-eval-print loop on stdin. With a terminal: prompts, readline line
 * editing and history; without one: the same evaluation, no prompts. */
void cli_repl(lua_State *L);

/* Set the globals `ember` and `F` as the REPL provides them (a failure to
 * load the package is a warning, not an error). */
void cli_repl_preload(lua_State *L);

/* ---- complete.c ---- */

/* Tab completion of Lua names (globals, fields, methods) for readline;
 * nothing without readline. */
void cli_complete_init(lua_State *L);

/* ---- launch.c ---- */

/* `ember launch`: argv[0] = "launch", then its options, script and args.
 * Returns the process exit status (0, 1 failed rank, 2 usage, 130/143). */
int cli_launch(int argc, char **argv);

/* "SIGSEGV" for 11; "unknown signal" otherwise. Safe in a signal handler. */
const char *cli_signal_name(int sig);

/* ---- rank_env.c ---- */

/* When EMBER_RANK is unset: EMBER_RANK, EMBER_WORLD_SIZE, EMBER_LOCAL_RANK
 * from Open MPI's, PMIx's or Slurm's variables (mpirun/srun by hand). */
void cli_rank_env(void);

/* Under `ember launch` (EMBER_LAUNCH_DIR set): SIGSEGV, SIGBUS, SIGFPE,
 * SIGABRT and SIGILL write a failure record, then end the process as usual. */
void cli_rank_fatal_signals(void);

/* Under `ember launch`: leave this process's pid in EMBER_LAUNCH_DIR
 * (rank<R>.pid), so the launcher can pass a Ctrl-C on to the ranks. */
void cli_rank_register(void);

#endif
