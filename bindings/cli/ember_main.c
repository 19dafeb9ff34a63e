/* ember_main.c — the `ember` executable: command line and subcommands.
 *
 * `ember` is a Lua 5.4 interpreter with Ember built in, so it follows lua.c
 * wherever lua.c has an answer (options -e -l -i -E -W, the `arg` table, `...`
 * for script arguments, LUA_INIT, "ember: msg + traceback" and status 1 on
 * error) and python's where it does not (a REPL with history, subcommands,
 * --help/--version, status 2 for a command line we refuse).
 *
 * Subcommands dispatch through one table, `commands` below. `run` and `repl`
 * are the interpreter in a fixed mode, `launch` is C (launch.c: it only runs
 * mpirun); the others are written in Lua: a line
 * {"NAME", cmd_lua, ...} makes `ember NAME args...` require the module
 * `ember.NAME_cli` (bindings/ember/NAME_cli.lua) and call its main(arg), where
 * `arg` is the usual table (arg[0] = "NAME", arg[1..] = the arguments). main
 * returns nothing/true for status 0, false for 1, or an integer status. A
 * build without the module answers "'NAME' is not available in this build".
 *
 * A first argument that is not a subcommand is a script or an option, so
 * `ember train.lua` is `ember run train.lua`; a script literally named `run`
 * is reached as `ember ./run`. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

#include "cli.h"
#include "ember/launch.h"
#include "ember/threads.h"

struct cli {
	int argc;
	char **argv;
	const char *command; /* subcommand name, NULL for the bare interpreter */
	int first;           /* argv index of the first option */
	int script;          /* argv index of the script, 0 if none */
	bool help, version, interactive, noenv, has_exec;
	int status;          /* process exit status */
};

struct command {
	const char *name;
	int (*run)(lua_State *L, struct cli *c);
	const char *usage;
	const char *summary;
};

static int cmd_run(lua_State *L, struct cli *c);
static int cmd_repl(lua_State *L, struct cli *c);
static int cmd_lua(lua_State *L, struct cli *c);
static int cmd_help(lua_State *L, struct cli *c);
static int cmd_launch(lua_State *L, struct cli *c);

static const struct command commands[] = {
	{"run", cmd_run, "run SCRIPT [ARGS]", "run a Lua script (also: ember SCRIPT [ARGS])"},
	{"repl", cmd_repl, "repl", "interactive prompt with `ember` and `F` preloaded (also for -e)"},
	{"launch", cmd_launch, "launch --nproc N ...", "run a script on N ranks through mpirun (ember launch --help)"},
	{"sweep", cmd_lua, "sweep ...", "run a campaign of configurations (ember sweep --help)"},
	{"attention", cmd_lua, "attention --matrix", "which attention kernel runs per head dim, dtype, causal, GQA, device"},
	{"help", cmd_help, "help", "show this help"},
};

/* ---- help and usage ---- */

static void print_help(FILE *f)
{
	fprintf(f, "usage: ember [options] [script [args]]\n"
	           "       ember COMMAND [args]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(f, "  %-20s %s\n", commands[i].usage, commands[i].summary);
	fprintf(f,
	  "\noptions (before the script, as for lua5.4):\n"
	  "  -e CODE              execute the string CODE (repeatable, runs in order)\n"
	  "  -l MOD               require module MOD into global MOD (-l g=MOD: into g)\n"
	  "  -i                   enter the REPL after the script and -e code\n"
	  "  -E                   ignore LUA_PATH, LUA_CPATH and LUA_INIT\n"
	  "  -W                   turn warnings on\n"
	  "  -v, --version        print the version\n"
	  "  -h, --help           print this help\n"
	  "  --                   stop handling options\n"
	  "  -                    run stdin as a script\n"
	  "\nexamples:\n"
	  "  ember train.lua --steps 100          a script with its own arguments\n"
	  "  ember run bench.lua --reps 10        the same, spelled out\n"
	  "  ember -l ember -e 'print(ember.ones(2, 3))'\n"
	  "  ember repl                           interactive; Ctrl-D exits\n"
	  "  ember -i setup.lua                   run setup.lua, then explore its globals\n"
	  "  echo '1 + 1' | ember repl            the REPL reads piped input too\n"
	  "  ember launch --nproc 2 scripts/bench_ddp.lua\n"
	  "  ember sweep examples/sweep_campaign.lua   a grid of runs, resumable (docs/sweeps.md)\n"
	  "\nThe `ember` Lua package is found next to the executable (build/lua) or\n"
	  "where it was installed; LUA_PATH, LUA_CPATH and LUA_INIT work as in lua5.4.\n");
}

static int usage_error(const char *fmt, const char *what)
{
	fprintf(stderr, "%s: ", EMBER_PROGNAME);
	fprintf(stderr, fmt, what);
	fprintf(stderr, "\nTry 'ember --help' for more information.\n");
	return EXIT_USAGE;
}

/* ---- options (pure C, before any Lua runs) ---- */

static bool is(const char *a, const char *s1, const char *s2)
{
	return strcmp(a, s1) == 0 || (s2 != NULL && strcmp(a, s2) == 0);
}

/* -e and -l take a value, attached (-eCODE) or in the next argument. */
static int option_with_value(struct cli *c, int i)
{
	const char *a = c->argv[i];
	if (a[2] != '\0')
		return i;
	if (i + 1 >= c->argc || c->argv[i + 1] == NULL)
		return -1;
	return i + 1;
}

/* lua.c's collectargs: sets the flags and c->script; returns EXIT_SUCCESS or
 * the status of a usage error it printed. */
static int collect_args(struct cli *c)
{
	for (int i = c->first; i < c->argc; i++) {
		const char *a = c->argv[i];
		if (a[0] != '-' || a[1] == '\0') { /* a script, or "-" for stdin */
			c->script = i;
			return EXIT_SUCCESS;
		}
		if (is(a, "--", NULL)) {
			c->script = i + 1 < c->argc ? i + 1 : 0;
			return EXIT_SUCCESS;
		}
		if (is(a, "-h", "--help"))
			c->help = true;
		else if (is(a, "-v", "--version"))
			c->version = true;
		else if (is(a, "-i", NULL))
			c->interactive = true;
		else if (is(a, "-E", NULL))
			c->noenv = true;
		else if (is(a, "-W", NULL))
			continue;
		else if (a[1] == 'e' || a[1] == 'l') {
			int v = option_with_value(c, i);
			if (v < 0)
				return usage_error("option '%s' needs an argument", a);
			c->has_exec |= a[1] == 'e';
			i = v;
		} else
			return usage_error("unrecognized option '%s'", a);
	}
	return EXIT_SUCCESS;
}

/* ---- running things ---- */

/* arg[0] = script (or the subcommand), arg[1..] its arguments, negative
 * indices for the interpreter and its options: what stock lua does. */
static void create_arg_table(lua_State *L, struct cli *c)
{
	int script = c->script;
	lua_createtable(L, c->argc - script - 1 > 0 ? c->argc - script - 1 : 0, script + 1);
	for (int i = 0; i < c->argc; i++) {
		lua_pushstring(L, c->argv[i]);
		lua_rawseti(L, -2, i - script);
	}
	lua_setglobal(L, "arg");
}

/* cli_report; under `ember launch` the rank's failure record goes first, so
 * the launcher can name this error as the first failure. */
static int report(lua_State *L, int status)
{
	if (status != LUA_OK && lua_type(L, -1) == LUA_TSTRING) {
		const char *msg = lua_tostring(L, -1);
		bool stopped = strncmp(msg, "interrupted!", 12) == 0; /* SIGINT, not a bug */
		em_launch_report_failure(stopped ? "terminated" : "error", msg);
	}
	return cli_report(L, status, true);
}

static int dochunk(lua_State *L, int status)
{
	if (status == LUA_OK)
		status = cli_docall(L, 0, 0);
	return report(L, status);
}

static int dostring(lua_State *L, const char *code, const char *name)
{
	return dochunk(L, luaL_loadbuffer(L, code, strlen(code), name));
}

/* -l MOD or -l g=MOD: g = require("MOD") */
static int dolibrary(lua_State *L, const char *spec)
{
	const char *eq = strchr(spec, '=');
	const char *mod = eq ? eq + 1 : spec;
	lua_getglobal(L, "require");
	lua_pushstring(L, mod);
	int status = cli_docall(L, 1, 1);
	if (status != LUA_OK)
		return report(L, status);
	if (eq)
		lua_pushlstring(L, spec, (size_t)(eq - spec));
	else
		lua_pushstring(L, spec);
	lua_insert(L, -2);
	lua_setglobal(L, lua_tostring(L, -2));
	lua_pop(L, 1);
	return LUA_OK;
}

/* -e, -l and -W in command-line order, as lua.c's runargs. */
static int run_args(lua_State *L, struct cli *c)
{
	int end = c->script ? c->script : c->argc;
	for (int i = c->first; i < end; i++) {
		const char *a = c->argv[i];
		if (is(a, "--", NULL))
			break;
		if (is(a, "-W", NULL))
			lua_warning(L, "@on", 0);
		if (a[1] != 'e' && a[1] != 'l')
			continue;
		int v = option_with_value(c, i);
		const char *value = v == i ? a + 2 : c->argv[v];
		static bool preloaded = false;   /* -e one-liners see `ember` and `F`, as the REPL does */
		if (a[1] == 'e' && !preloaded) { cli_repl_preload(L); preloaded = true; }
		int status = a[1] == 'e' ? dostring(L, value, "=(command line)")
		                         : dolibrary(L, value);
		if (status != LUA_OK)
			return status;
		i = v;
	}
	return LUA_OK;
}

static int push_script_args(lua_State *L)
{
	lua_getglobal(L, "arg");
	int n = (int)luaL_len(L, -1);
	luaL_checkstack(L, n + 3, "too many arguments to script");
	for (int i = 1; i <= n; i++)
		lua_rawgeti(L, -i, i);
	lua_remove(L, -n - 1);
	return n;
}

/* A name like "lanch" that is no file was probably meant as a subcommand. */
static void explain_missing(lua_State *L, const char *fname)
{
	if (strchr(fname, '/') != NULL || strchr(fname, '.') != NULL)
		return;
	lua_pushfstring(L, "%s\n('%s' is not a subcommand either; see 'ember --help')",
	                lua_tostring(L, -1), fname);
	lua_remove(L, -2);
}

static int run_script(lua_State *L, struct cli *c)
{
	const char *fname = c->argv[c->script];
	if (strcmp(fname, "-") == 0 && !is(c->argv[c->script - 1], "--", NULL))
		fname = NULL; /* stdin */
	int status = luaL_loadfile(L, fname);
	if (status == LUA_ERRFILE && fname != NULL)
		explain_missing(L, fname);
	if (status == LUA_OK) {
		int n = push_script_args(L);
		status = cli_docall(L, n, LUA_MULTRET);
	}
	return report(L, status);
}

enum mode { MODE_DEFAULT, MODE_RUN, MODE_REPL };

static int check_mode(struct cli *c, enum mode mode)
{
	if (mode == MODE_RUN && c->script == 0)
		return usage_error("%s: no script given (usage: ember run SCRIPT [ARGS])", "run");
	if (mode == MODE_REPL && c->script != 0)
		return usage_error("repl: unexpected argument '%s' (to run a script and then "
		                   "enter the REPL: ember -i SCRIPT)", c->argv[c->script]);
	return EXIT_SUCCESS;
}

static void enter_repl(lua_State *L)
{
	cli_repl_preload(L);
	cli_repl(L);
}

/* lua.c's pmain after the options: environment, -e/-l, script, REPL. */
static int interpreter(lua_State *L, struct cli *c, enum mode mode)
{
	int status = collect_args(c);
	if (status == EXIT_SUCCESS && !c->help)
		status = check_mode(c, mode);
	if (status != EXIT_SUCCESS)
		return status;
	if (c->help) {
		print_help(stdout);
		return EXIT_SUCCESS;
	}
	if (c->version)
		printf("%s\n", cli_version_string());
	cli_open(L, c->noenv);
	create_arg_table(L, c);
	if ((!c->noenv && cli_luainit(L) != LUA_OK) || run_args(L, c) != LUA_OK)
		return EXIT_FAILURE;
	if (c->script && run_script(L, c) != LUA_OK)
		return EXIT_FAILURE;
	if (mode == MODE_REPL || c->interactive)
		enter_repl(L);
	else if (c->script == 0 && !c->has_exec && !c->version) {
		if (isatty(STDIN_FILENO))
			enter_repl(L);
		else if (dochunk(L, luaL_loadfile(L, NULL)) != LUA_OK)
			return EXIT_FAILURE;
	}
	return EXIT_SUCCESS;
}

static int cmd_run(lua_State *L, struct cli *c)
{
	return interpreter(L, c, MODE_RUN);
}

static int cmd_repl(lua_State *L, struct cli *c)
{
	return interpreter(L, c, MODE_REPL);
}

/* The launcher needs no Lua: it parses its options and runs mpirun. */
static int cmd_launch(lua_State *L, struct cli *c)
{
	(void)L;
	return cli_launch(c->argc - 1, c->argv + 1);
}

static int cmd_help(lua_State *L, struct cli *c)
{
	print_help(stdout);
	return EXIT_SUCCESS;
}

/* ---- subcommands written in Lua ---- */

static bool module_available(lua_State *L, const char *modname)
{
	lua_getglobal(L, "package");
	lua_getfield(L, -1, "preload");
	lua_getfield(L, -1, modname);
	bool found = !lua_isnil(L, -1);
	lua_pop(L, 2);
	if (!found) {
		lua_getfield(L, -1, "searchpath");
		lua_pushstring(L, modname);
		lua_getfield(L, -3, "path");
		lua_call(L, 2, 1);
		found = !lua_isnil(L, -1);
		lua_pop(L, 1);
	}
	lua_pop(L, 1);
	return found;
}

/* Leaves the module's main function on the stack, or returns an error. */
static int load_main(lua_State *L, const char *modname)
{
	lua_getglobal(L, "require");
	lua_pushstring(L, modname);
	int status = cli_docall(L, 1, 1);
	if (status != LUA_OK)
		return status;
	if (lua_istable(L, -1)) {
		lua_getfield(L, -1, "main");
		lua_remove(L, -2);
	}
	if (!lua_isfunction(L, -1)) {
		lua_pop(L, 1);
		lua_pushfstring(L, "module '%s' returned no main function", modname);
		return LUA_ERRRUN;
	}
	return LUA_OK;
}

static int status_from_result(lua_State *L)
{
	int status = EXIT_SUCCESS;
	if (lua_isinteger(L, -1))
		status = (int)lua_tointeger(L, -1);
	else if (lua_isboolean(L, -1) && !lua_toboolean(L, -1))
		status = EXIT_FAILURE;
	lua_pop(L, 1);
	return status;
}

static int cmd_lua(lua_State *L, struct cli *c)
{
	cli_open(L, false);
	c->script = 1; /* arg[0] = the subcommand's name */
	create_arg_table(L, c);
	if (cli_luainit(L) != LUA_OK)
		return EXIT_FAILURE;
	const char *modname = lua_pushfstring(L, "ember.%s_cli", c->command);
	if (!module_available(L, modname)) {
		fprintf(stderr, "%s: '%s' is not available in this build (no Lua module %s)\n",
		        EMBER_PROGNAME, c->command, modname);
		return EXIT_USAGE;
	}
	int status = load_main(L, modname);
	if (status == LUA_OK) {
		lua_getglobal(L, "arg");
		status = cli_docall(L, 1, 1);
	}
	if (report(L, status) != LUA_OK)
		return EXIT_FAILURE;
	return status_from_result(L);
}

/* ---- entry ---- */

static const struct command *find_command(const char *name)
{
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (strcmp(commands[i].name, name) == 0)
			return &commands[i];
	return NULL;
}

static int pmain(lua_State *L)
{
	struct cli *c = lua_touserdata(L, 1);
	luaL_checkversion(L);
	lua_settop(L, 0);
	const struct command *cmd = c->argc > 1 ? find_command(c->argv[1]) : NULL;
	c->command = cmd ? cmd->name : NULL;
	c->first = cmd ? 2 : 1;
	c->status = cmd ? cmd->run(L, c) : interpreter(L, c, MODE_DEFAULT);
	return 0;
}

/* OpenBLAS loaded kernels older than this CPU (engine/blas_core.c: old
 * OpenBLAS versions take Prescott's for an Intel model they do not know, as
 * virtual machines often present): run again with OPENBLAS_CORETYPE naming
 * the right ones, which OpenBLAS reads only when it loads. Once:
 * EMBER_BLAS_REEXEC marks the second run (and says what was replaced);
 * EMBER_BLAS_FIX=0 or a user's own OPENBLAS_CORETYPE turns it off. */
static void blas_core_fix(char **argv)
{
	const char *off = getenv("EMBER_BLAS_FIX");
	if (getenv("OPENBLAS_CORETYPE") || getenv("EMBER_BLAS_REEXEC") || (off && strcmp(off, "0") == 0))
		return;
	const char *better = em_blas_better_core();
	if (better == NULL)
		return;
	setenv("OPENBLAS_CORETYPE", better, 1);
	const char *was = getenv("EMBER_BLAS_ASSUME_CORE");
	setenv("EMBER_BLAS_REEXEC", was && *was ? was : em_blas_corename(), 1);
	execv("/proc/self/exe", argv);
	unsetenv("OPENBLAS_CORETYPE"); /* no /proc: go on with the old kernels */
	unsetenv("EMBER_BLAS_REEXEC");
}

int main(int argc, char **argv)
{
	static char *no_args[] = {EMBER_PROGNAME, NULL};
	if (argc < 1 || argv[0] == NULL) {
		argc = 1;
		argv = no_args;
	}
	blas_core_fix(argv);
	cli_rank_env();           /* EMBER_RANK & co under mpirun or srun */
	cli_rank_fatal_signals(); /* failure records under `ember launch` */
	cli_rank_register();      /* and the pid its Ctrl-C goes to */
	lua_State *L = luaL_newstate();
	if (L == NULL) {
		fprintf(stderr, "%s: cannot create Lua state: not enough memory\n", EMBER_PROGNAME);
		return EXIT_FAILURE;
	}
	struct cli c = {.argc = argc, .argv = argv};
	lua_pushcfunction(L, pmain);
	lua_pushlightuserdata(L, &c);
	int status = report(L, lua_pcall(L, 1, 0, 0));
	fflush(stdout);
	lua_close(L);
	return status == LUA_OK ? c.status : EXIT_FAILURE;
}
