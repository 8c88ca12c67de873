#!/usr/bin/env bash
# Builds the image `dpca:local` that docker-compose.yml runs: the release programs
# and the shared libraries they link (found with ldd), copied into a root filesystem
# under deploy/rootfs, then `FROM scratch`. Needs cargo, ldd and a Docker engine;
# pulls no image. Also writes the caller's user and group ids to .env and makes
# ./compose-out, for docker-compose.yml.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
rootfs="$root/deploy/rootfs"

# Each role built on its own: one build of the three would unify their features,
# and the proxy would link the development CA the user asks for.
for prog in proxy owner user; do
    cargo build --release --quiet --manifest-path "$root/Cargo.toml" -p "$prog"
done
# Where cargo put them: CARGO_TARGET_DIR (or the config's target-dir) if set.
target="$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
    sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')"
[ -n "$target" ] || { echo "cannot find cargo's target folder" >&2; exit 1; }

rm -rf "$rootfs"
mkdir -p "$rootfs"/{bin,data,etc,tmp}
for prog in proxy owner user; do
    cp "$target/release/$prog" "$rootfs/bin/$prog"
    # Debug info is for profiling on the build machine, not for the image.
    strip "$rootfs/bin/$prog"
    # Every library the program links, at the path the dynamic loader looks for it.
    ldd "$target/release/$prog" | grep -o '/[^ ]*' | while read -r lib; do
        mkdir -p "$rootfs$(dirname "$lib")"
        cp -L "$lib" "$rootfs$lib"
    done
done

# The bundled table's public bounds and its header alone: all the data user is
# given. The rows are not in the image: the setup step that splits them among the
# owners reads them from the workspace (a bind mount in docker-compose.yml).
cp "$root/data/optdigits.bounds.csv" "$rootfs/data/"
head -n 1 "$root/data/optdigits.csv" >"$rootfs/data/optdigits.schema.csv"

echo "dpca:x:65532:65532:dpca:/tmp:/nonexistent" >"$rootfs/etc/passwd"
echo "dpca:x:65532:" >"$rootfs/etc/group"
# Mount points: a named volume starts as a copy of the folder it is mounted on, so
# these are writable by whichever user the compose file runs the roles as.
# The per-party folders exist in the image for the same reason (a volume mounted
# where the image has nothing starts owned by root): up to 20 owners.
parties="proxy user"
for i in $(seq -w 1 20); do parties="$parties owner-$i"; done
for d in tmp pki state journal invite own out; do mkdir -p "$rootfs/$d"; done
for p in $parties; do mkdir -p "$rootfs/pki/$p" "$rootfs/own/$p"; done
find "$rootfs/tmp" "$rootfs/pki" "$rootfs/state" "$rootfs/journal" "$rootfs/invite" "$rootfs/own" "$rootfs/out" \
    -type d -exec chmod 1777 {} +

docker build --quiet -t dpca:local "$root/deploy" >/dev/null
echo "built image dpca:local ($(du -sh "$rootfs" | cut -f1) root filesystem)"

# The host side of docker-compose.yml: the roles run as the caller's user (ids in
# .env, which docker-compose reads), so the user's outputs in ./compose-out are the
# caller's and writable by the container; the folder made now, by the caller,
# not later by Docker as root.
env_file="$root/.env"
touch "$env_file"
grep -q '^DPCA_UID=' "$env_file" || echo "DPCA_UID=$(id -u)" >>"$env_file"
grep -q '^DPCA_GID=' "$env_file" || echo "DPCA_GID=$(id -g)" >>"$env_file"
mkdir -p "$root/compose-out"
