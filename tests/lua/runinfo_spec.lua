-- runinfo_spec.lua — ember.runinfo's commit: Ember's own, never the one of a
-- repository that happens to enclose the working directory or a copy of
-- Ember's tree. Each case runs in a child `ember` without EMBER_COMMIT (which
-- would override every lookup) and in a scratch directory with its own git
-- repositories.
local SPEC = debug.getinfo(1, "S").source:match("^@(.*)$")
local U = dofile((SPEC:match("^(.*/)") or "./") .. "helpers.lua")
local q, sh = U.q, U.sh
-- absolute: the children run in other directories
local BUILD = (sh("cd " .. q(os.getenv("EMBER_BUILD") or "./build") .. " && pwd")):gsub("%s+$", "")
local EMBER = BUILD .. "/ember"

local has_git = os.execute("git --version >/dev/null 2>&1")

-- git_commit(src) as a child ember computes it, run from `cwd`
local function commit_of(src, cwd)
  local code = ("io.write(require('ember.runinfo').git_commit(%s))"):format(src and ("%q"):format(src) or "nil")
  local out, ok = sh(("cd %s && env -u EMBER_COMMIT %s -e %s"):format(q(cwd or "."), q(EMBER), q(code)))
  assert(ok, out)
  return out
end

local function git_repo(dir)
  local out, ok = sh(("mkdir -p %s && cd %s && git init -q . && git -c user.name=t -c user.email=t@t " ..
    "commit -q --allow-empty -m first && git rev-parse --short HEAD"):format(q(dir), q(dir)))
  assert(ok, out)
  return (out:gsub("%s+$", ""))
end

describe("ember.runinfo.git_commit", function()
  local root
  before_each(function()
    if not has_git then return end
    root = os.tmpname()
    os.remove(root)
    assert(os.execute("mkdir -p " .. q(root)))
  end)
  after_each(function()
    if root then os.execute("rm -rf " .. q(root)) end
    root = nil
  end)

  local function need_git()
    if not has_git then pending("git is not installed: the commit lookup cannot be exercised") end
    return has_git
  end

  it("is the commit of a source tree that is its own git checkout", function()
    if not need_git() then return end
    local head = git_repo(root .. "/ember-src")
    assert.are.equal(head, commit_of(root .. "/ember-src"))
  end)

  it("marks a checkout with changed tracked files +dirty", function()
    if not need_git() then return end
    local src = root .. "/ember-src"
    git_repo(src)
    local out, ok = sh(("cd %s && echo a > f && git add f && git -c user.name=t -c user.email=t@t commit -q -m f " ..
      "&& echo b > f && git rev-parse --short HEAD"):format(q(src)))
    assert(ok, out)
    assert.are.equal((out:gsub("%s+$", "")) .. "+dirty", commit_of(src))
  end)

  it("never reports the repository that encloses a copy of the tree without .git", function()
    if not need_git() then return end
    local outer = git_repo(root)
    local copy = root .. "/vendor/ember"
    assert(os.execute("mkdir -p " .. q(copy)))
    local got = commit_of(copy, copy)
    assert.are_not.equal(outer, got)
    assert.is_nil(got:find(outer, 1, true))
    -- what is left is the commit stamped when this build was made, or "unknown"
    local stamp = dofile(BUILD .. "/lua/ember/build_stamp.lua").commit
    assert.are.equal(stamp, got)
  end)

  it("ignores the repository around the working directory", function()
    if not need_git() then return end
    local outer = git_repo(root .. "/user-project")
    local got = commit_of(nil, root .. "/user-project")
    assert.is_nil(got:find(outer, 1, true))
  end)

  it("falls back to the build stamp when the source tree is gone", function()
    local stamp = dofile(BUILD .. "/lua/ember/build_stamp.lua").commit
    assert.is_string(stamp)
    assert.are.equal(stamp, commit_of("/nonexistent/ember-source"))
  end)

  it("takes EMBER_COMMIT over every lookup", function()
    local out, ok = sh(("EMBER_COMMIT=abc1234-test %s -e %s"):format(q(EMBER),
      q("io.write(require('ember.runinfo').collect('cpu').commit)")))
    assert(ok, out)
    assert.are.equal("abc1234-test", out)
  end)
end)
