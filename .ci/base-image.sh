#!/usr/bin/env bash
# The local base image the controller/agent and gpu-sim images are built on where no container registry can be
# reached (CI): Debian bookworm, minbase + python3 (debootstrap), imported into Docker.
#
#   .ci/base-image.sh [IMAGE]        IMAGE: default $GPUREMEDIATE_BASE_IMAGE, else gpuremediate-base:bookworm
#
# The root filesystem's tarball is cached in $GPUREMEDIATE_CACHE_DIR (default /var/cache/gpuremediate), keyed by
# the recipe below: a later run imports it (seconds) instead of running debootstrap again (minutes); a missing
# or partial tarball is made again. An image already in Docker with this recipe's label is left as it is.
# debootstrap needs root (and Debian's debootstrap package); the mirror is the one apt uses here.
# GPUREMEDIATE_BASE_CACHED_ONLY=1: import from the cache only; exit 3 where that would need debootstrap (the tests).
set -euo pipefail

IMAGE=${1:-${GPUREMEDIATE_BASE_IMAGE:-gpuremediate-base:bookworm}}
CACHE_DIR=${GPUREMEDIATE_CACHE_DIR:-/var/cache/gpuremediate}
SUITE=bookworm
INCLUDE=python3,ca-certificates
# Dropped from the root filesystem, as the slim images drop them: apt's package lists and caches, docs, locales.
TRIM=(var/lib/apt/lists var/cache/apt var/cache/debconf/templates.dat-old usr/share/doc usr/share/man
      usr/share/info usr/share/locale)
RECIPE="debootstrap --variant=minbase --include=$INCLUDE $SUITE; trim ${TRIM[*]}"
KEY=$(printf '%s' "$RECIPE" | sha256sum | cut -c1-12)
TARBALL="$CACHE_DIR/base-$SUITE-$KEY.tar"
LABEL=io.gpuremediate.base.recipe

say() { echo "base-image: $*"; }

mirror() {
    # The first Debian archive apt is configured with (deb822 sources, else sources.list), else deb.debian.org.
    local found=""
    if [ -r /etc/apt/sources.list.d/debian.sources ]; then
        found=$(awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
            /etc/apt/sources.list.d/debian.sources)
    fi
    if [ -z "$found" ] && [ -r /etc/apt/sources.list ]; then
        found=$(awk '$1 == "deb" && $3 !~ /security/ { print $2; exit }' /etc/apt/sources.list)
    fi
    echo "${found:-http://deb.debian.org/debian}"
}

if [ "$(docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$IMAGE" 2>/dev/null || true)" = "$KEY" ]; then
    say "$IMAGE is present (recipe $KEY)"
    exit 0
fi

if [ ! -s "$TARBALL" ]; then
    if [ "${GPUREMEDIATE_BASE_CACHED_ONLY:-}" = 1 ]; then say "$IMAGE absent and $TARBALL not cached"; exit 3; fi
    command -v debootstrap >/dev/null || { say "debootstrap is not installed (apt-get install -y debootstrap)" >&2; exit 2; }
    [ "$(id -u)" = 0 ] || { say "debootstrap needs root" >&2; exit 2; }
    mkdir -p "$CACHE_DIR"
    rootfs=$(mktemp -d "${TMPDIR:-/tmp}/gpuremediate-rootfs.XXXXXX")
    trap 'rm -rf "$rootfs" "$TARBALL.part"' EXIT
    url=$(mirror)
    say "no cached root filesystem ($TARBALL): debootstrap $SUITE from $url (a few minutes)"
    start=$(date +%s)
    debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$rootfs" "$url" >"$rootfs.log" 2>&1 || {
        tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; say "debootstrap failed" >&2; exit 1; }
    rm -f "$rootfs.log"
    for path in "${TRIM[@]}"; do rm -rf "${rootfs:?}/$path"; done
    mkdir -p "$rootfs/var/lib/apt/lists/partial" "$rootfs/var/cache/apt/archives/partial"
    tar --numeric-owner -C "$rootfs" -cf "$TARBALL.part" .
    mv "$TARBALL.part" "$TARBALL"
    say "cached $TARBALL ($(du -h "$TARBALL" | cut -f1), $(($(date +%s) - start)) s)"
else
    say "using the cached root filesystem $TARBALL"
fi

docker import --change "LABEL $LABEL=$KEY" --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' - "$IMAGE" <"$TARBALL" >/dev/null
say "imported $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{ printf "%.0f MB", $1 / 1e6 }'))"
