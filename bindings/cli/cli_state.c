/* cli_state.c — prepare a lua_State for Ember and run chunks in it.
 *
 * Why ember.core is preloaded rather than found on package.cpath: the binding
 * is linked into this executable, so `require "ember.core"` must return that
 * copy; loading build/lua/ember/core.so as well would give two engines (two
 * allocators, two CUDA contexts' worth of state) in one process.
 *
 * Why the package directory goes *first* on package.path (before LUA_PATH):
 * the Lua half of the package must match the C half compiled into this binary,
 * so an executable in build/ uses build/lua and an installed one the installed
 * files, whatever the environment says. Everything else (other modules,
 * LUA_PATH, LUA_INIT, -E) behaves as in lua.c.
 *
 * Running code: cli_docall is lua.c's docall — a traceback message handler,
 * and SIGINT turned into a Lua error "interrupted!" through a debug hook, so
 * Ctrl-C stops a long training loop without killing the REPL around it. A
 * second Ctrl-C while the hook has not fired yet (e.g. inside a long C call)
 * gets the default action and ends the process, as in lua.c. A script may
 * defer the error to a point of its choosing (see stop_hook). */
#define _POSIX_C_SOURCE 200809L

#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lualib.h>

#include "cli.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif
#ifndef EMBER_BUILD_LUA_DIR /* CMake defines it; a bare compile still works */
#define EMBER_BUILD_LUA_DIR "lua"
#endif

int luaopen_ember_core(lua_State *L); /* bindings/lua, linked in */

/* ---- package.path and ember.core ---- */

static bool has_package(const char *dir)
{
	char path[PATH_MAX];
	int n = snprintf(path, sizeof path, "%s/ember/init.lua", dir);
	return n > 0 && (size_t)n < sizeof path && access(path, R_OK) == 0;
}

/* The directory holding this executable (resolved through /proc/self/exe,
 * so symlinks to it still find the build tree). */
static bool exe_dir(char *buf, size_t size)
{
	ssize_t len = readlink("/proc/self/exe", buf, size - 1);
	if (len <= 0)
		return false;
	buf[len] = '\0';
	char *slash = strrchr(buf, '/');
	if (slash == NULL)
		return false;
	*slash = '\0';
	return true;
}

/* out = dir + suffix, if that fits and holds the package. */
static bool candidate(char *out, size_t size, const char *dir, const char *suffix)
{
	int n = snprintf(out, size, "%s%s", dir, suffix);
	return n > 0 && (size_t)n < size && has_package(out);
}

/* Where the `ember` Lua package lives: the build tree beside the executable,
 * an install relative to it, the configured install prefix, and finally the
 * build directory this binary was compiled in. */
static void find_lua_dir(char *out, size_t size)
{
	char exe[PATH_MAX];
	if (exe_dir(exe, sizeof exe) && (candidate(out, size, exe, "/lua") ||
	                                 candidate(out, size, exe, "/../share/lua/5.4")))
		return;
#ifdef EMBER_INSTALL_LUA_DIR
	if (candidate(out, size, EMBER_INSTALL_LUA_DIR, ""))
		return;
#endif
	snprintf(out, size, "%s", EMBER_BUILD_LUA_DIR);
}

static void prepend_package_path(lua_State *L, const char *dir)
{
	lua_getglobal(L, "package");
	lua_getfield(L, -1, "path");
	const char *old = lua_tostring(L, -1);
	lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir, old ? old : "");
	lua_setfield(L, -3, "path");
	lua_pop(L, 2);
}

static void preload_core(lua_State *L)
{
	luaL_getsubtable(L, LUA_REGISTRYINDEX, LUA_PRELOAD_TABLE);
	lua_pushcfunction(L, luaopen_ember_core);
	lua_setfield(L, -2, "ember.core");
	lua_pop(L, 1);
}

void cli_open(lua_State *L, bool noenv)
{
	if (noenv) { /* read by luaopen_package, as in lua.c */
		lua_pushboolean(L, 1);
		lua_setfield(L, LUA_REGISTRYINDEX, "LUA_NOENV");
	}
	luaL_openlibs(L);
	preload_core(L);
	char dir[PATH_MAX];
	find_lua_dir(dir, sizeof dir);
	prepend_package_path(L, dir);
	lua_gc(L, LUA_GCGEN, 0, 0); /* as stock lua 5.4 does */
}

/* ---- running chunks ---- */

static lua_State *running_L;
static volatile sig_atomic_t sigint_seen;

/* While the registry field "ember.defer_interrupt" is true (a training loop
 * between steps sets it, bindings/ember/util.lua), Ctrl-C does not raise: it
 * sets "ember.interrupt_pending", which the loop reads at a step boundary, so
 * a checkpoint never holds a half-applied optimizer step. */
static void stop_hook(lua_State *L, lua_Debug *ar)
{
	(void)ar;
	lua_sethook(L, NULL, 0, 0);
	lua_getfield(L, LUA_REGISTRYINDEX, "ember.defer_interrupt");
	int defer = lua_toboolean(L, -1);
	lua_pop(L, 1);
	if (defer) {
		lua_pushboolean(L, 1);
		lua_setfield(L, LUA_REGISTRYINDEX, "ember.interrupt_pending");
		return;
	}
	luaL_error(L, "interrupted!");
}

static void on_sigint_running(int sig)
{
	signal(sig, SIG_DFL); /* a second Ctrl-C ends the process */
	int mask = LUA_MASKCALL | LUA_MASKRET | LUA_MASKLINE | LUA_MASKCOUNT;
	lua_sethook(running_L, stop_hook, mask, 1);
}

static void on_sigint_input(int sig)
{
	(void)sig;
	sigint_seen = 1;
}

static void set_sigint(void (*handler)(int), struct sigaction *old)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = handler;
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = 0; /* no SA_RESTART: a blocked read returns EINTR */
	sigaction(SIGINT, &sa, old);
}

void cli_sigint_for_input(void)
{
	set_sigint(on_sigint_input, NULL);
}

void cli_sigint_default(void)
{
	set_sigint(SIG_DFL, NULL);
}

bool cli_take_sigint(void)
{
	bool seen = sigint_seen;
	sigint_seen = 0;
	return seen;
}

/* Message handler: the error message plus a traceback; non-string errors
 * through __tostring, as in lua.c. */
static int msghandler(lua_State *L)
{
	const char *msg = lua_tostring(L, 1);
	if (msg == NULL) {
		if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING)
			return 1;
		msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
	}
	luaL_traceback(L, L, msg, 1);
	return 1;
}

int cli_docall(lua_State *L, int narg, int nres)
{
	int base = lua_gettop(L) - narg;
	lua_pushcfunction(L, msghandler);
	lua_insert(L, base);
	running_L = L;
	struct sigaction old;
	set_sigint(on_sigint_running, &old);
	int status = lua_pcall(L, narg, nres, base);
	sigaction(SIGINT, &old, NULL);
	if (lua_gethook(L) == stop_hook) /* Ctrl-C arrived as the call ended */
		lua_sethook(L, NULL, 0, 0);
	lua_remove(L, base);
	return status;
}

int cli_report(lua_State *L, int status, bool prefix)
{
	if (status == LUA_OK)
		return status;
	const char *msg = lua_tostring(L, -1);
	if (msg == NULL)
		msg = "(error object is not a string)";
	fflush(stdout); /* keep the order of output and errors in one log */
	if (prefix)
		fprintf(stderr, "%s: ", EMBER_PROGNAME);
	fprintf(stderr, "%s\n", msg);
	fflush(stderr);
	lua_pop(L, 1);
	return status;
}

/* ---- LUA_INIT ---- */

int cli_luainit(lua_State *L)
{
	const char *name = "=LUA_INIT_5_4";
	const char *init = getenv(name + 1);
	if (init == NULL) {
		name = "=LUA_INIT";
		init = getenv(name + 1);
	}
	if (init == NULL)
		return LUA_OK;
	int status = init[0] == '@' ? luaL_loadfile(L, init + 1)
	                            : luaL_loadbuffer(L, init, strlen(init), name);
	if (status == LUA_OK)
		status = cli_docall(L, 0, 0);
	return cli_report(L, status, true);
}

/* ---- version ---- */

const char *cli_version_string(void)
{
#ifdef EMBER_CUDA /* set by the engine target when built with CUDA */
	return "ember " EMBER_VERSION_STR " (" LUA_RELEASE ", CUDA on)";
#else
	return "ember " EMBER_VERSION_STR " (" LUA_RELEASE ", CUDA off)";
#endif
}
