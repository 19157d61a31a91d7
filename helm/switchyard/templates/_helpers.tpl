{{/*
Names and labels.
*/}}
{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the hook-scoped copies used by the migrate job (room left for "-migrate"). */}}
{{- define "switchyard.migrateName" -}}
{{- printf "%s-migrate" (include "switchyard.fullname" . | trunc 55 | trimSuffix "-") }}
{{- end }}

{{- define "switchyard.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Selects the server pods only, never the migrate job's pod. */}}
{{- define "switchyard.serverSelectorLabels" -}}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/component: server
{{- end }}

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ include "switchyard.chart" . }}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: switchyard
{{- end }}

{{- define "switchyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "switchyard.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The migrate hook runs before the release's own resources exist, so with serviceAccount.create
it gets a hook-scoped account of its own; otherwise the existing one.
*/}}
{{- define "switchyard.migrateServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- include "switchyard.migrateName" . }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "switchyard.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/* The Secret the pods load: the operator's, or the chart's. */}}
{{- define "switchyard.secretName" -}}
{{- default (include "switchyard.fullname" .) .Values.existingSecret }}
{{- end }}

{{/*
drainTimeout as written (500ms, 30s, 5m, 1h, 1d or bare seconds), and in whole seconds
(rounded up) for the grace period.
*/}}
{{- define "switchyard.drainTimeout" -}}
{{- toString .Values.drainTimeout | trim }}
{{- end }}

{{- define "switchyard.drainTimeoutSeconds" -}}
{{- $d := include "switchyard.drainTimeout" . }}
{{- if regexMatch "^[0-9]+ms$" $d }}
{{- div (add (atoi (trimSuffix "ms" $d)) 999) 1000 }}
{{- else if regexMatch "^[0-9]+s?$" $d }}
{{- atoi (trimSuffix "s" $d) }}
{{- else if regexMatch "^[0-9]+m$" $d }}
{{- mul (atoi (trimSuffix "m" $d)) 60 }}
{{- else if regexMatch "^[0-9]+h$" $d }}
{{- mul (atoi (trimSuffix "h" $d)) 3600 }}
{{- else if regexMatch "^[0-9]+d$" $d }}
{{- mul (atoi (trimSuffix "d" $d)) 86400 }}
{{- else }}
{{- fail (printf "drainTimeout %q is not a duration: use 500ms, 30s, 5m, 1h or a number of seconds" $d) }}
{{- end }}
{{- end }}

{{/*
The kubelet's grace period counts from the pod's deletion and includes the preStop sleep, so
it must cover the sleep, the drain and the shutdown that follows it.
*/}}
{{- define "switchyard.terminationGracePeriodSeconds" -}}
{{- $floor := add (int .Values.preStopSleepSeconds) (include "switchyard.drainTimeoutSeconds" . | atoi) }}
{{- $explicit := .Values.terminationGracePeriodSeconds }}
{{- if and (not (kindIs "invalid" $explicit)) (ne (toString $explicit) "") }}
{{- if le (int $explicit) (int $floor) }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed preStopSleepSeconds + drainTimeout (%d s), or pods are killed mid-drain" (int $explicit) (int $floor)) }}
{{- end }}
{{- int $explicit }}
{{- else }}
{{- add $floor (int .Values.terminationGraceMarginSeconds) }}
{{- end }}
{{- end }}

{{/*
SWITCHYARD_PUBLIC_BASE_URL: publicBaseUrl, else the first ingress host (https when listed
under ingress.tls).
*/}}
{{- define "switchyard.publicBaseUrl" -}}
{{- if .Values.publicBaseUrl }}
{{- trimSuffix "/" .Values.publicBaseUrl }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts }}
{{- $host := (first .Values.ingress.hosts).host }}
{{- $tls := false }}
{{- range .Values.ingress.tls }}
{{- if has $host (.hosts | default list) }}
{{- $tls = true }}
{{- end }}
{{- end }}
{{- printf "%s://%s" (ternary "https" "http" $tls) $host }}
{{- end }}
{{- end }}

{{/*
Fails rendering with a clear message when the clustered mode is not fully configured.
Included by every template that starts a Switchyard process.
*/}}
{{- define "switchyard.validate" -}}
{{- $v := .Values }}
{{- if $v.existingSecret }}
{{- if or $v.database.url $v.keys.signing $v.keys.encryption $v.s3.accessKeyId $v.s3.secretAccessKey $v.s3.sessionToken }}
{{- fail (printf "existingSecret %q is set: leave database.url, keys.*, s3.accessKeyId, s3.secretAccessKey and s3.sessionToken empty and put SWITCHYARD_DATABASE_URL, SWITCHYARD_SIGNING_KEYS, SWITCHYARD_ENCRYPTION_KEYS, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in that Secret" $v.existingSecret) }}
{{- end }}
{{- else }}
{{- if not $v.database.url }}
{{- fail "database.url is required (postgres://USER:PASSWORD@HOST:5432/DB), or existingSecret naming a Secret with SWITCHYARD_DATABASE_URL: this chart runs the clustered mode only" }}
{{- end }}
{{- if not (regexMatch "^postgres(ql)?://" $v.database.url) }}
{{- fail "database.url must be a Postgres URL (postgres://...): the clustered mode does not run on SQLite" }}
{{- end }}
{{- if not $v.keys.signing }}
{{- fail "keys.signing is required (comma-separated; generate one with `openssl rand -hex 32`), or use existingSecret: every pod must sign download URLs with the same keys" }}
{{- end }}
{{- if not $v.keys.encryption }}
{{- fail "keys.encryption is required (comma-separated base64 32-byte keys; generate one with `openssl rand -base64 32`), or use existingSecret" }}
{{- end }}
{{- range splitList "," $v.keys.encryption }}
{{- $k := trim . }}
{{- if and $k (not (regexMatch "^[A-Za-z0-9+/]{43}=$" $k)) }}
{{- fail "keys.encryption: every key must be 32 bytes in standard base64 (44 characters ending in '='), e.g. from `openssl rand -base64 32`" }}
{{- end }}
{{- end }}
{{- if not (and $v.s3.accessKeyId $v.s3.secretAccessKey) }}
{{- fail "s3.accessKeyId and s3.secretAccessKey are required (Switchyard reads AWS credentials from the environment only), or use existingSecret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" }}
{{- end }}
{{- end }}
{{- if not $v.nats.url }}
{{- fail "nats.url is required (e.g. nats://nats:4222): without NATS the pods cannot route work to each other" }}
{{- end }}
{{- if not $v.redis.url }}
{{- fail "redis.url is required (e.g. redis://redis-master:6379): without Redis each pod keeps its own ephemeral state" }}
{{- end }}
{{- if not $v.s3.bucket }}
{{- fail "s3.bucket is required: without S3 each pod keeps files on its own disk" }}
{{- end }}
{{- $base := include "switchyard.publicBaseUrl" . }}
{{- if not $base }}
{{- fail "publicBaseUrl is required (e.g. https://connectors.example.com), or enable the ingress with a host: webhook registration and download links need an absolute external URL" }}
{{- end }}
{{- if not (regexMatch "^https?://[^/]+" $base) }}
{{- fail (printf "publicBaseUrl %q must be an absolute http:// or https:// URL" $base) }}
{{- end }}
{{- if lt (int $v.replicaCount) 1 }}
{{- fail "replicaCount must be at least 1" }}
{{- end }}
{{- $owned := list "listen" "metrics_listen" "data_dir" "database_url" "database_schema" "database_max_connections" "nats_url" "nats_subject_prefix" "redis_url" "redis_key_prefix" "s3" "pod_id" "public_base_url" "signing_keys" "encryption_keys" "drain_timeout" "log" }}
{{- range $k, $_ := $v.config }}
{{- if has $k $owned }}
{{- fail (printf "config.%s is set by the chart: use its dedicated value in values.yaml instead" $k) }}
{{- end }}
{{- end }}
{{- $_ := include "switchyard.terminationGracePeriodSeconds" . }}
{{- end }}

{{/*
Flattens the `config` map into SWITCHYARD_* ConfigMap entries ("__" between nested keys).
Numbers are printed as integers: Helm reads YAML numbers as floats, which would otherwise
print as 1.048576e+08.
*/}}
{{- define "switchyard.flattenConfig" -}}
{{- $prefix := .prefix }}
{{- range $k, $v := .map }}
{{- $name := printf "%s%s" $prefix (upper $k) }}
{{- if kindIs "map" $v }}
{{- include "switchyard.flattenConfig" (dict "prefix" (printf "%s__" $name) "map" $v) }}
{{- else if kindIs "slice" $v }}
{{ $name }}: {{ join "," $v | quote }}
{{- else if kindIs "float64" $v }}
{{ $name }}: {{ ternary (int64 $v | toString) (toString $v) (eq $v (float64 (int64 $v))) | quote }}
{{- else }}
{{ $name }}: {{ toString $v | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* ConfigMap data: every non-secret setting, as environment variables. */}}
{{- define "switchyard.configData" -}}
SWITCHYARD_LISTEN: {{ printf "0.0.0.0:%d" (int .Values.containerPorts.http) | quote }}
SWITCHYARD_METRICS_LISTEN: {{ printf "0.0.0.0:%d" (int .Values.containerPorts.metrics) | quote }}
SWITCHYARD_PUBLIC_BASE_URL: {{ include "switchyard.publicBaseUrl" . | quote }}
SWITCHYARD_DRAIN_TIMEOUT: {{ include "switchyard.drainTimeout" . | quote }}
SWITCHYARD_DATABASE_MAX_CONNECTIONS: {{ int .Values.database.maxConnections | toString | quote }}
{{- with .Values.database.schema }}
SWITCHYARD_DATABASE_SCHEMA: {{ . | quote }}
{{- end }}
SWITCHYARD_NATS_SUBJECT_PREFIX: {{ .Values.nats.subjectPrefix | quote }}
SWITCHYARD_REDIS_KEY_PREFIX: {{ .Values.redis.keyPrefix | quote }}
SWITCHYARD_S3__BUCKET: {{ .Values.s3.bucket | quote }}
{{- with .Values.s3.endpoint }}
SWITCHYARD_S3__ENDPOINT: {{ . | quote }}
{{- end }}
SWITCHYARD_S3__REGION: {{ .Values.s3.region | quote }}
SWITCHYARD_S3__FORCE_PATH_STYLE: {{ .Values.s3.forcePathStyle | toString | quote }}
SWITCHYARD_LOG__FORMAT: {{ .Values.log.format | quote }}
SWITCHYARD_LOG__LEVEL: {{ .Values.log.level | quote }}
{{- include "switchyard.flattenConfig" (dict "prefix" "SWITCHYARD_" "map" .Values.config) }}
{{- end }}

{{/* Secret data (the chart-managed Secret only). */}}
{{- define "switchyard.secretData" -}}
SWITCHYARD_DATABASE_URL: {{ .Values.database.url | b64enc | quote }}
SWITCHYARD_SIGNING_KEYS: {{ .Values.keys.signing | b64enc | quote }}
SWITCHYARD_ENCRYPTION_KEYS: {{ .Values.keys.encryption | b64enc | quote }}
AWS_ACCESS_KEY_ID: {{ .Values.s3.accessKeyId | b64enc | quote }}
AWS_SECRET_ACCESS_KEY: {{ .Values.s3.secretAccessKey | b64enc | quote }}
{{- with .Values.s3.sessionToken }}
AWS_SESSION_TOKEN: {{ . | b64enc | quote }}
{{- end }}
{{- range $k, $v := .Values.extraSecretEnv }}
{{ $k }}: {{ toString $v | b64enc | quote }}
{{- end }}
{{- end }}

{{/*
Container environment shared by the server and the migrate job. The NATS and Redis URLs are
set here rather than in the ConfigMap so that they can refer to Secret variables with
$(NAME): Kubernetes expands references in `env` values only.
*/}}
{{- define "switchyard.env" -}}
- name: SWITCHYARD_POD_ID
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: SWITCHYARD_NATS_URL
  value: {{ .Values.nats.url | quote }}
- name: SWITCHYARD_REDIS_URL
  value: {{ .Values.redis.url | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* envFrom: (dict "ctx" $ "configMap" NAME "secret" NAME). The Secret wins over the ConfigMap. */}}
{{- define "switchyard.envFrom" -}}
- configMapRef:
    name: {{ .configMap }}
- secretRef:
    name: {{ .secret }}
{{- with .ctx.Values.extraEnvFrom }}
{{ toYaml . }}
{{- end }}
{{- end }}
