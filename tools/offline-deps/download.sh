#!/bin/sh
# Download the Debian packages that a GPU host without network access needs
# to build and test the project (Lua 5.4, lua-cjson, busted and its modules,
# lua-argparse, OpenBLAS, PCRE2 for the tokenizer) and the demo's corpus
# (Debian's fortunes: English text, unpacked under PREFIX/usr/share/games).
# Run on a machine that reaches Debian's package archive:
#   sh tools/offline-deps/download.sh .deps        (from the project root)
# then carry .deps to the GPU host and run: sh .deps/install.sh .deps /opt/deps
set -eu
dir=${1:-.deps}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dir"
cp "$here/install.sh" "$dir/install.sh"   # the carried folder installs itself
cd "$dir"
pkgs="lua5.4 liblua5.4-0 liblua5.4-dev lua-cjson lua-busted lua-cliargs lua-dkjson
lua-filesystem lua-luassert lua-mediator lua-penlight lua-say lua-system lua-term
libreadline8 readline-common lua-argparse
libopenblas0 libopenblas0-pthread libopenblas-dev libopenblas-pthread-dev libgfortran5
libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
fortunes fortunes-min"
[ -n "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v lock)" ] || apt-get update >/dev/null
apt-get download $pkgs >/dev/null
ls -1 *.deb | wc -l | xargs echo "packages downloaded into $dir:"
