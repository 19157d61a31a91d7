#!/usr/bin/env bash
# Re-pins the Dockerfile's base images to the digests their tags point at now:
#
#   scripts/pin-images.sh          # rewrites RUST_IMAGE and RUNTIME_IMAGE in ./Dockerfile
#
# Needs registry access and one of `docker buildx imagetools` or `crane`. Review the diff
# (and the images' changelogs) before committing: the digest is what the release builds from.
set -euo pipefail
cd "$(dirname "$0")/.."

digest_of() {
    local ref=$1
    if docker buildx version >/dev/null 2>&1; then
        docker buildx imagetools inspect "$ref" --format '{{json .Manifest}}' |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])'
    elif command -v crane >/dev/null 2>&1; then
        crane digest "$ref"
    else
        echo "pin-images: neither docker buildx nor crane is installed" >&2
        exit 1
    fi
}

for arg in RUST_IMAGE RUNTIME_IMAGE; do
    current=$(sed -n "s/^ARG $arg=//p" Dockerfile)
    tag=${current%@*}
    digest=$(digest_of "$tag")
    case $digest in sha256:*) ;; *) echo "pin-images: no digest for $tag: $digest" >&2; exit 1 ;; esac
    sed -i "s|^ARG $arg=.*|ARG $arg=$tag@$digest|" Dockerfile
    echo "$arg=$tag@$digest"
done
