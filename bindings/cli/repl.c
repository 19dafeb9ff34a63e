/* repl.c — `ember repl`: lua.c's read-eval-print loop, plus what a REPL used
 * for interactive profiling needs.
 *
 * Evaluation is lua.c's: a line is first tried as `return <line>` so an
 * expression prints its values (tab-separated, through the global `print`,
 * so tensors use their __tostring); otherwise it is a statement, and while it
 * fails to compile only because it ends early ("<eof>") the REPL reads more
 * lines under a `>>` prompt. Errors print a traceback and the loop goes on.
 *
 * Input: on a terminal, GNU readline (when built with it) gives line editing,
 * Tab completion of Lua names (complete.c) and history in ~/.ember_history,
 * kept to the last 1000 lines. Ctrl-C at the prompt drops the statement being
 * typed (it does not end the REPL, unlike lua.c); Ctrl-C while code runs is
 * the "interrupted!" error from cli_docall. Ctrl-D ends the REPL. When stdin
 * is not a terminal, lines are read plainly with no prompts or banner, so a
 * session can be piped in and its output checked. */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>

#ifdef EMBER_READLINE
#include <readline/history.h>
#include <readline/readline.h>
#endif

#include "cli.h"

#define HISTORY_LINES 1000

enum line_status { LINE_OK, LINE_CANCEL, LINE_EOF };

/* loadline's results besides Lua statuses */
#define LOAD_EOF (-1)
#define LOAD_CANCEL (-2)

static struct {
	bool tty;      /* prompts, banner, editing, history */
	char *history; /* history file, NULL when not kept */
} repl;

/* ---- reading lines ---- */

static enum line_status read_plain(const char *prompt, char **line)
{
	if (prompt != NULL) {
		fputs(prompt, stdout);
		fflush(stdout);
	}
	size_t cap = 0;
	*line = NULL;
	errno = 0;
	if (getline(line, &cap, stdin) >= 0)
		return LINE_OK;
	free(*line);
	*line = NULL;
	if (errno == EINTR && cli_take_sigint()) {
		clearerr(stdin);
		fputc('\n', stdout);
		return LINE_CANCEL;
	}
	return LINE_EOF;
}

#ifdef EMBER_READLINE
static bool line_cancelled;

/* readline's getc, except that Ctrl-C (SIGINT without SA_RESTART, see
 * cli_sigint_for_input) ends the line and marks it cancelled. */
static int getc_interruptible(FILE *f)
{
	for (;;) {
		unsigned char ch;
		ssize_t n = read(fileno(f), &ch, 1);
		if (n == 1)
			return ch;
		if (n == 0 || errno != EINTR)
			return EOF;
		if (cli_take_sigint()) {
			line_cancelled = true;
			rl_point = rl_end; /* show "^C" after all that was typed */
			rl_redisplay();
			fputs("^C", rl_outstream);
			return '\n';
		}
	}
}

static enum line_status read_edited(const char *prompt, char **line)
{
	line_cancelled = false;
	*line = readline(prompt);
	if (line_cancelled) {
		free(*line);
		*line = NULL;
		return LINE_CANCEL;
	}
	return *line != NULL ? LINE_OK : LINE_EOF;
}
#endif

static enum line_status read_line(const char *prompt, char **line)
{
	cli_take_sigint(); /* a Ctrl-C from before this prompt is spent */
#ifdef EMBER_READLINE
	if (repl.tty)
		return read_edited(prompt, line);
#endif
	return read_plain(prompt, line);
}

/* Whether the input layer already ended the line after Ctrl-D: readline
 * 8.1+ does so when bracketed paste is on. */
static bool eof_echoed(void)
{
#ifdef EMBER_READLINE
	const char *paste = rl_variable_value("enable-bracketed-paste");
	return rl_readline_version >= 0x0801 && paste != NULL && strcmp(paste, "on") == 0;
#else
	return false;
#endif
}

/* ---- history ---- */

static void history_open(void)
{
#ifdef EMBER_READLINE
	const char *home = getenv("HOME");
	if (home == NULL || home[0] == '\0')
		return;
	size_t size = strlen(home) + sizeof "/.ember_history";
	repl.history = malloc(size);
	if (repl.history == NULL)
		return;
	snprintf(repl.history, size, "%s/.ember_history", home);
	stifle_history(HISTORY_LINES);
	if (read_history(repl.history) == ENOENT)
		write_history(repl.history); /* create it, so appends work */
	history_truncate_file(repl.history, HISTORY_LINES);
#endif
}

/* Each entry is appended at once, so os.exit() or a crash loses nothing. */
static void history_save(const char *entry)
{
#ifdef EMBER_READLINE
	if (repl.history == NULL || entry[0] == '\0')
		return;
	add_history(entry);
	append_history(1, repl.history);
#else
	(void)entry;
#endif
}

static void history_close(void)
{
#ifdef EMBER_READLINE
	if (repl.history != NULL)
		history_truncate_file(repl.history, HISTORY_LINES);
#endif
	free(repl.history);
	repl.history = NULL;
}

/* ---- lua.c's loadline ---- */

/* Pushes the prompt: _PROMPT / _PROMPT2 if set, as in lua.c. */
static const char *push_prompt(lua_State *L, bool first)
{
	if (!repl.tty) {
		lua_pushnil(L);
		return NULL;
	}
	if (lua_getglobal(L, first ? "_PROMPT" : "_PROMPT2") == LUA_TNIL) {
		lua_pop(L, 1);
		lua_pushstring(L, first ? "> " : ">> ");
	}
	const char *p = luaL_tolstring(L, -1, NULL);
	lua_remove(L, -2);
	return p;
}

/* Pushes the next line without its newline; nothing on CANCEL/EOF. */
static enum line_status push_line(lua_State *L, bool first)
{
	char *line;
	enum line_status st = read_line(push_prompt(L, first), &line);
	lua_pop(L, 1);
	if (st != LINE_OK)
		return st;
	size_t len = strlen(line);
	if (len > 0 && line[len - 1] == '\n')
		line[--len] = '\0';
	if (first && line[0] == '=') /* "=expr", as lua.c still accepts */
		lua_pushfstring(L, "return %s", line + 1);
	else
		lua_pushlstring(L, line, len);
	free(line);
	return LINE_OK;
}

static int add_return(lua_State *L)
{
	const char *line = lua_tostring(L, -1);
	const char *retline = lua_pushfstring(L, "return %s;", line);
	int status = luaL_loadbuffer(L, retline, strlen(retline), "=stdin");
	if (status == LUA_OK) {
		lua_remove(L, -2);
		history_save(line);
	} else {
		lua_pop(L, 2);
	}
	return status;
}

/* A syntax error at "<eof>" means "keep typing". */
static bool incomplete(lua_State *L, int status)
{
	static const char mark[] = "<eof>";
	const size_t marklen = sizeof mark - 1;
	size_t len;
	if (status != LUA_ERRSYNTAX)
		return false;
	const char *msg = lua_tolstring(L, -1, &len);
	if (len < marklen || strcmp(msg + len - marklen, mark) != 0)
		return false;
	lua_pop(L, 1);
	return true;
}

static int multiline(lua_State *L)
{
	for (;;) {
		size_t len;
		const char *code = lua_tolstring(L, 1, &len);
		int status = luaL_loadbuffer(L, code, len, "=stdin");
		if (!incomplete(L, status)) {
			history_save(code);
			return status;
		}
		enum line_status st = push_line(L, false);
		if (st == LINE_CANCEL)
			return LOAD_CANCEL;
		if (st == LINE_EOF) { /* report what is missing, then stop */
			history_save(code);
			return luaL_loadbuffer(L, code, len, "=stdin");
		}
		lua_pushliteral(L, "\n");
		lua_insert(L, -2);
		lua_concat(L, 3);
	}
}

/* Leaves a compiled chunk (LUA_OK) or an error message on an empty stack. */
static int load_line(lua_State *L)
{
	lua_settop(L, 0);
	enum line_status st = push_line(L, true);
	if (st != LINE_OK)
		return st == LINE_EOF ? LOAD_EOF : LOAD_CANCEL;
	int status = add_return(L);
	if (status != LUA_OK)
		status = multiline(L);
	if (status == LOAD_CANCEL) {
		lua_settop(L, 0);
		return status;
	}
	lua_remove(L, 1);
	return status;
}

/* ---- eval and print ---- */

static void print_results(lua_State *L)
{
	int n = lua_gettop(L);
	if (n == 0)
		return;
	luaL_checkstack(L, LUA_MINSTACK, "too many results to print");
	lua_getglobal(L, "print");
	lua_insert(L, 1);
	if (lua_pcall(L, n, 0, 0) != LUA_OK) {
		lua_pushfstring(L, "error calling 'print' (%s)", lua_tostring(L, -1));
		cli_report(L, LUA_ERRRUN, false);
	}
}

static void banner(void)
{
	printf("%s\n`ember` and `F` (= ember.nn.functional) are loaded; "
	       "Tab completes, Ctrl-C cancels, Ctrl-D exits.\n", cli_version_string());
}

static void input_init(lua_State *L)
{
#ifdef EMBER_READLINE
	rl_readline_name = "ember"; /* for $if ember in ~/.inputrc */
	rl_catch_signals = 0;       /* Ctrl-C is ours: see getc_interruptible */
	rl_getc_function = getc_interruptible;
#endif
	cli_sigint_for_input();
	history_open();
	cli_complete_init(L);
}

void cli_repl(lua_State *L)
{
	repl.tty = isatty(STDIN_FILENO);
	if (repl.tty) {
		banner();
		input_init(L);
	}
	int status;
	while ((status = load_line(L)) != LOAD_EOF) {
		if (status == LOAD_CANCEL)
			continue;
		if (status == LUA_OK)
			status = cli_docall(L, 0, LUA_MULTRET);
		if (status == LUA_OK)
			print_results(L);
		else
			cli_report(L, status, false);
		fflush(stdout);
	}
	lua_settop(L, 0);
	history_close();
	if (repl.tty) {
		cli_sigint_default();
		if (!eof_echoed())
			fputc('\n', stdout);
	}
	fflush(stdout);
}

/* ---- the globals a REPL session starts with ---- */

static const char preload_code[] =
	"local ok, m = pcall(require, 'ember')\n"
	"if not ok then\n"
	"  io.stderr:write('ember: warning: package ember did not load: ', tostring(m), '\\n')\n"
	"  return\n"
	"end\n"
	"if ember == nil then ember = m end\n"
	"if F == nil then\n"
	"  local okf, f = pcall(function() return m.nn.functional end)\n"
	"  if okf and f ~= nil then F = f end\n"
	"end\n";

void cli_repl_preload(lua_State *L)
{
	int status = luaL_loadbuffer(L, preload_code, sizeof preload_code - 1, "=repl");
	if (status == LUA_OK)
		status = cli_docall(L, 0, 0);
	cli_report(L, status, true);
}
