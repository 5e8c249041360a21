#!/usr/bin/env bash
# Installs canopy under PREFIX (default /usr/local): the binary, a man page
# for it and for each subcommand (section 8), bash, zsh and fish
# completions, and the mount helper link that lets mount(8) and /etc/fstab
# mount fuse.canopy images (root only, into /sbin).
#
#   bash scripts/install.sh [PREFIX]        # or: make install [PREFIX=...]
set -euo pipefail
prefix="${1:-${PREFIX:-/usr/local}}"
cd "$(dirname "$0")/.."

cargo install --locked --path . --root "$prefix"
bin="$prefix/bin/canopy"

man="$prefix/share/man/man8"
"$bin" generate man "$man"

comp="$prefix/share"
mkdir -p "$comp/bash-completion/completions" "$comp/zsh/site-functions" \
    "$comp/fish/vendor_completions.d"
"$bin" generate completions bash >"$comp/bash-completion/completions/canopy"
"$bin" generate completions zsh >"$comp/zsh/site-functions/_canopy"
"$bin" generate completions fish >"$comp/fish/vendor_completions.d/canopy.fish"

# mount(8) runs /sbin/mount.fuse.canopy with a cleared PATH.
if [ "$(id -u)" = 0 ] && [ -d /sbin ]; then
    ln -sf "$bin" /sbin/mount.fuse.canopy
    echo "mount helper: /sbin/mount.fuse.canopy -> $bin"
fi
echo "installed: $bin, man pages in $man (man canopy), completions in $comp"
