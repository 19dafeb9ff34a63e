/* complete.c — Tab completion of Lua names in the REPL (readline only).
 *
 * Exploring `ember.nn.<Tab>` or `opt:<Tab>` beats reading docs/api.md in the
 * middle of a profiling session. The matching is a short Lua function (it
 * walks live values: tables and their __index chains), so it sees whatever
 * the session has defined; C only hands its results to readline. '.' and ':'
 * are not word breaks, so a whole dotted path is completed at once. Inside an
 * unfinished string literal, readline's own file name completion runs
 * instead (ember.load("ckpt/<Tab>")). */
#define _POSIX_C_SOURCE 200809L

#include <lauxlib.h>

#include "cli.h"

#ifdef EMBER_READLINE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <readline/readline.h>

static const char matcher_code[] =
	"local text = ...\n"
	"local base, sep, part = text:match('^(.*)([.:])([%w_]*)$')\n"
	"if not base then base, sep, part = '', '', text end\n"
	"local obj = _G\n"
	"for name in base:gmatch('[^.:]+') do\n"
	"  obj = obj[name]\n"
	"  if obj == nil then return {} end\n"
	"end\n"
	"local out, seen = {}, {}\n"
	"local function add(t)\n"
	"  for k, v in pairs(t) do\n"
	"    if type(k) == 'string' and not seen[k] and k:find('^[%a_][%w_]*$')\n"
	"       and k:sub(1, #part) == part and (sep ~= ':' or type(v) == 'function') then\n"
	"      seen[k] = true\n"
	"      out[#out + 1] = base .. sep .. k\n"
	"    end\n"
	"  end\n"
	"end\n"
	"local o = obj\n"
	"for _ = 1, 8 do\n"
	"  if type(o) == 'table' then add(o) end\n"
	"  local mt = getmetatable(o)\n"
	"  o = type(mt) == 'table' and rawget(mt, '__index') or nil\n"
	"  if o == nil then break end\n"
	"end\n"
	"table.sort(out)\n"
	"return out\n";

static lua_State *complete_L;
static const char matcher_key = 'm'; /* registry keys: their addresses */
static const char matches_key = 'r';

/* readline's generator: state 0 computes the list, then one per call. */
static char *next_match(const char *text, int state)
{
	static lua_Integer next;
	lua_State *L = complete_L;
	if (state == 0) {
		next = 0;
		lua_rawgetp(L, LUA_REGISTRYINDEX, &matcher_key);
		lua_pushstring(L, text);
		if (lua_pcall(L, 1, 1, 0) != LUA_OK || !lua_istable(L, -1)) {
			lua_pop(L, 1);
			lua_newtable(L);
		}
		lua_rawsetp(L, LUA_REGISTRYINDEX, &matches_key);
	}
	lua_rawgetp(L, LUA_REGISTRYINDEX, &matches_key);
	lua_rawgeti(L, -1, ++next);
	const char *s = lua_tostring(L, -1);
	char *copy = s != NULL ? strdup(s) : NULL;
	lua_pop(L, 2);
	return copy;
}

static bool inside_string(int start)
{
	int single = 0, dbl = 0;
	for (int i = 0; i < start && rl_line_buffer[i] != '\0'; i++) {
		single += rl_line_buffer[i] == '\'' && dbl % 2 == 0;
		dbl += rl_line_buffer[i] == '"' && single % 2 == 0;
	}
	return single % 2 == 1 || dbl % 2 == 1;
}

static char **complete(const char *text, int start, int end)
{
	(void)end;
	if (inside_string(start))
		return NULL; /* file names */
	rl_attempted_completion_over = 1;
	rl_completion_append_character = '\0';
	return rl_completion_matches(text, next_match);
}

void cli_complete_init(lua_State *L)
{
	if (luaL_loadbuffer(L, matcher_code, sizeof matcher_code - 1, "=complete") != LUA_OK) {
		lua_pop(L, 1);
		return;
	}
	lua_rawsetp(L, LUA_REGISTRYINDEX, &matcher_key);
	complete_L = L;
	rl_basic_word_break_characters = " \t\n\"'`@$><=;|&{(,)}[]+-*%^~#";
	rl_attempted_completion_function = complete;
}

#else

void cli_complete_init(lua_State *L)
{
	(void)L;
}

#endif
