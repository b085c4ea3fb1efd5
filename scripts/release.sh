#!/usr/bin/env bash
# Builds and pushes the release image for amd64 and arm64 from the tag vVERSION, then pins the
# pushed image by digest in deploy/kubernetes/base/kustomization.yaml (`images:`), for the release
# commit's follow-up. docs/release.md "Cutting a release" is the whole procedure.
#
#   scripts/release.sh REGISTRY/ratelimit-server X.Y.Z      # docker buildx, pushes
#   scripts/release.sh --pin-only REGISTRY/ratelimit-server X.Y.Z sha256:…   # only the pin
#   scripts/release.sh --check                                # CI: the pin step on a copy
#
# Both architectures compile on the build machine's platform (the Dockerfile's builder stage is
# `--platform=$BUILDPLATFORM`, with a cross linker from Debian), so no emulated compiler; only the
# runtime stage's `--version` and `check config` run the target's binary, which on the other
# architecture needs binfmt emulation (`docker run --privileged --rm tonistiigi/binfmt --install
# arm64`) or a native builder node. The binary carries its dependency list (cargo-auditable);
# BuildKit's SBOM and provenance attestations are attached as well (--sbom, --provenance).
set -euo pipefail
cd "$(dirname "$0")/.."
kustomization=deploy/kubernetes/base/kustomization.yaml

# Rewrites the `images:` entry of KUSTOMIZATION to NAME:TAG@DIGEST.
pin() { # KUSTOMIZATION NAME TAG DIGEST
  python3 - "$@" <<'EOF'
import re, sys
path, name, tag, digest = sys.argv[1:]
assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"not a digest: {digest}"
text = open(path).read()
entry = re.compile(r"^images:\n(?:  .*\n|    .*\n)*", re.M)
assert entry.search(text), f"{path} has no images: entry"
new = (f"images:\n  - name: ratelimit-server\n    newName: {name}\n    newTag: {tag}\n"
       f"    digest: {digest}\n")
open(path, "w").write(entry.sub(new, text, count=1))
EOF
}

case "${1:-}" in
  --check)
    # The pin, on a copy of deploy/, rendered: the Deployment's image is the digest.
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    cp -r deploy "$tmp/"
    digest=sha256:$(printf 'ratelimit-server' | sha256sum | cut -d' ' -f1)
    pin "$tmp/$kustomization" registry.example/ratelimit-server 0.0.0 "$digest"
    rendered=$("${KUBECTL:-kubectl}" kustomize "$tmp/deploy/kubernetes/base" | grep 'image: ')
    echo "release --check: the base renders $(echo "$rendered" | xargs)"
    echo "$rendered" | grep -q "image: registry.example/ratelimit-server:0.0.0@$digest" ||
      { echo "error: the pinned digest is not what the base renders" >&2; exit 1; }
    ;;
  --pin-only)
    pin "$kustomization" "$2" "$3" "$4"
    ;;
  -*|"")
    echo "usage: $0 REGISTRY/ratelimit-server X.Y.Z | --pin-only NAME X.Y.Z DIGEST | --check" >&2
    exit 2
    ;;
  *)
    image=$1 version=${2:?version X.Y.Z}
    tag=v$version
    [ "$(git rev-parse HEAD)" = "$(git rev-parse "$tag^{commit}")" ] ||
      { echo "error: check out $tag first" >&2; exit 1; }
    [ -z "$(git status --porcelain)" ] || { echo "error: the work tree is not clean" >&2; exit 1; }
    grep -q "^ARG VERSION=$version\$" Dockerfile || { echo "error: Dockerfile's VERSION is not $version" >&2; exit 1; }
    minor=${version%.*} major=${version%%.*}
    mkdir -p target
    docker buildx build --platform linux/amd64,linux/arm64 \
      --build-arg VERSION="$version" \
      --build-arg REVISION="$(git rev-parse HEAD)" \
      --build-arg SOURCE="${SOURCE:-https://github.com/OWNER/ratelimit-server}" \
      --sbom=true --provenance=mode=max \
      -t "$image:$version" -t "$image:$minor" -t "$image:$major" \
      --metadata-file target/release-metadata.json --push .
    digest=$(python3 -c 'import json; print(json.load(open("target/release-metadata.json"))["containerimage.digest"])')
    pin "$kustomization" "$image" "$version" "$digest"
    echo "pushed $image:$version@$digest (also :$minor, :$major); $kustomization pins it:"
    git diff --stat -- "$kustomization"
    ;;
esac
