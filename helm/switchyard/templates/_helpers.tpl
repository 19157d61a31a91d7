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

{{/* The host agents' mTLS Service (room left for "-hosts"). */}}
{{- define "switchyard.hostsServiceName" -}}
{{- printf "%s-hosts" (include "switchyard.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* The admin listener's Service: console, /admin/v1 (room left for "-admin"). */}}
{{- define "switchyard.adminServiceName" -}}
{{- printf "%s-admin" (include "switchyard.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{/* The internal listener's Service: metrics, probes (room left for "-internal"). */}}
{{- define "switchyard.internalServiceName" -}}
{{- printf "%s-internal" (include "switchyard.fullname" . | trunc 54 | trimSuffix "-") }}
{{- end }}

{{/*
"true" when the preStop hook may use the kubelet's sleep action: preStopNativeSleep is on and
the cluster is 1.30 or newer (the action does not exist before, and the chart supports
>= 1.23). Empty otherwise, and the exec form is rendered.
*/}}
{{- define "switchyard.nativeSleep" -}}
{{- if and .Values.preStopNativeSleep (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) }}true{{ end }}
{{- end }}

{{/* Where hosts.ca.existingSecret is mounted (tls.crt and tls.key). */}}
{{- define "switchyard.hostsCaDir" -}}
/etc/switchyard/hosts-ca
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
A duration value as written; a YAML number (read as a float) prints as an integer.
*/}}
{{- define "switchyard.durationString" -}}
{{- if kindIs "float64" . }}
{{- ternary (int64 . | toString) (toString .) (eq . (float64 (int64 .))) }}
{{- else }}
{{- toString . | trim }}
{{- end }}
{{- end }}

{{/*
(dict "name" NAME "value" DURATION) -> milliseconds, or fails naming NAME. Accepts what the
binary accepts: 500ms, 30s, 5m, 1h, 1d or bare seconds.
*/}}
{{- define "switchyard.durationMs" -}}
{{- $d := .value }}
{{- if regexMatch "^[0-9]+ms$" $d }}
{{- atoi (trimSuffix "ms" $d) }}
{{- else if regexMatch "^[0-9]+s?$" $d }}
{{- mul (atoi (trimSuffix "s" $d)) 1000 }}
{{- else if regexMatch "^[0-9]+m$" $d }}
{{- mul (atoi (trimSuffix "m" $d)) 60000 }}
{{- else if regexMatch "^[0-9]+h$" $d }}
{{- mul (atoi (trimSuffix "h" $d)) 3600000 }}
{{- else if regexMatch "^[0-9]+d$" $d }}
{{- mul (atoi (trimSuffix "d" $d)) 86400000 }}
{{- else }}
{{- fail (printf "%s %q is not a duration: use 500ms, 30s, 5m, 1h, 7d or a number of seconds" .name $d) }}
{{- end }}
{{- end }}

{{/* The [hosts] durations hosts.timeouts may set (SWITCHYARD_HOSTS__<KEY>). */}}
{{- define "switchyard.hostsTimeoutKeys" -}}
register_timeout heartbeat_response create_run_accept event_delivery cancel_confirm upload_url_ttl download_url_ttl keepalive heartbeat_interval host_lost_after enrollment_ttl approval_ttl run_retention jwt_ttl tick
{{- end }}

{{/*
SWITCHYARD_HOSTS__TLS_NAMES: the mTLS Service's in-cluster names plus hosts.tls.names, as a
JSON array of strings (figment reads an environment value written [..] as an array; the
binary adds localhost, 127.0.0.1 and the host of public_base_url itself).
*/}}
{{- define "switchyard.hostsTlsNames" -}}
{{- $svc := include "switchyard.hostsServiceName" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- range .Values.hosts.tls.names }}
{{- $names = append $names (toString .) }}
{{- end }}
{{- toJson (uniq $names) }}
{{- end }}

{{/* SWITCHYARD_OPERATOR_TOKENS: name=token,name=token from `operators`. */}}
{{- define "switchyard.operatorTokens" -}}
{{- $entries := list }}
{{- range .Values.operators }}
{{- $entries = append $entries (printf "%s=%s" .name .token) }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{/*
Fails rendering when a hosts.* value or `operators` is not usable. Part of switchyard.validate.
*/}}
{{- define "switchyard.validateHosts" -}}
{{- $v := .Values }}
{{- $h := $v.hosts }}
{{- if $h.enabled }}
{{- $port := int $h.tls.port }}
{{- if or (lt $port 1) (gt $port 65535) }}
{{- fail (printf "hosts.tls.port %v must be a port number (1-65535)" $h.tls.port) }}
{{- end }}
{{- if or (eq $port (int $v.containerPorts.http)) (eq $port (int $v.containerPorts.metrics)) (eq $port (int $v.containerPorts.admin)) }}
{{- fail (printf "hosts.tls.port %d is already containerPorts.http, .metrics or .admin: the mTLS listener needs a port of its own" $port) }}
{{- end }}
{{- if not (has (toString $h.service.type) (list "LoadBalancer" "NodePort" "ClusterIP")) }}
{{- fail (printf "hosts.service.type %q must be LoadBalancer, NodePort or ClusterIP" (toString $h.service.type)) }}
{{- end }}
{{- $sport := int $h.service.port }}
{{- if or (lt $sport 1) (gt $sport 65535) }}
{{- fail (printf "hosts.service.port %v must be a port number (1-65535)" $h.service.port) }}
{{- end }}
{{- range $h.tls.names }}
{{- $n := toString . }}
{{- $dns := and (le (len $n) 253) (regexMatch "^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$" $n) }}
{{- $ipv6 := regexMatch "^[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*$" $n }}
{{- if not (or $dns $ipv6) }}
{{- fail (printf "hosts.tls.names: %q is not a DNS name or an IP address (no wildcards, no ports, no URLs): the pods could not issue their mTLS certificate" $n) }}
{{- end }}
{{- end }}
{{- end }}
{{- with $h.ca.existingSecret }}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" .) }}
{{- fail (printf "hosts.ca.existingSecret %q is not a valid Secret name" .) }}
{{- end }}
{{- if not ($v.podSecurityContext | default dict).fsGroup }}
{{- fail "hosts.ca.existingSecret needs podSecurityContext.fsGroup: the CA key is mounted with mode 0440 and read through the pod's group" }}
{{- end }}
{{- end }}
{{- with $h.clientCertHeader }}
{{- if not (regexMatch "^[A-Za-z0-9!#$%&'*+.^_|~-]+$" .) }}
{{- fail (printf "hosts.clientCertHeader %q is not an HTTP header name (ingress-nginx uses ssl-client-cert)" .) }}
{{- end }}
{{- if not (or $h.ingressProof.secret $h.ingressProof.sources $v.existingSecret) }}
{{- fail "hosts.clientCertHeader needs hosts.ingressProof: a secret the ingress sends (ingressProof.secret) and/or its address ranges (ingressProof.sources); the pods refuse to start without one" }}
{{- end }}
{{- end }}
{{- with $h.ingressProof.secret }}
{{- if $v.existingSecret }}
{{- fail (printf "existingSecret %q is set: leave hosts.ingressProof.secret empty and put SWITCHYARD_HOSTS_INGRESS_SECRET in that Secret" $v.existingSecret) }}
{{- end }}
{{- if not (regexMatch "^[^,\\s]{16,}$" .) }}
{{- fail "hosts.ingressProof.secret needs 16+ characters without ',' or spaces, e.g. from `openssl rand -hex 32`" }}
{{- end }}
{{- end }}
{{- $known := splitList " " (include "switchyard.hostsTimeoutKeys" .) }}
{{- $t := $h.timeouts | default dict }}
{{- range $k, $val := $t }}
{{- if not (has $k $known) }}
{{- fail (printf "hosts.timeouts.%s is not a host timeout; known: %s (other [hosts] settings go under config.hosts)" $k (join ", " $known)) }}
{{- end }}
{{- $ms := include "switchyard.durationMs" (dict "name" (printf "hosts.timeouts.%s" $k) "value" (include "switchyard.durationString" $val)) | atoi }}
{{- if eq $ms 0 }}
{{- fail (printf "hosts.timeouts.%s must be longer than 0" $k) }}
{{- end }}
{{- end }}
{{- $hr := include "switchyard.durationMs" (dict "name" "hosts.timeouts.heartbeat_response" "value" (include "switchyard.durationString" (get $t "heartbeat_response" | default "5s"))) | atoi }}
{{- $hi := include "switchyard.durationMs" (dict "name" "hosts.timeouts.heartbeat_interval" "value" (include "switchyard.durationString" (get $t "heartbeat_interval" | default "30s"))) | atoi }}
{{- $hl := include "switchyard.durationMs" (dict "name" "hosts.timeouts.host_lost_after" "value" (include "switchyard.durationString" (get $t "host_lost_after" | default "90s"))) | atoi }}
{{- if ge $hr $hi }}
{{- fail "hosts.timeouts: heartbeat_response (default 5s) must be shorter than heartbeat_interval (default 30s)" }}
{{- end }}
{{- if le $hl $hi }}
{{- fail "hosts.timeouts: host_lost_after (default 90s) must be longer than heartbeat_interval (default 30s)" }}
{{- end }}
{{- with ($v.config | default dict).hosts }}
{{- if kindIs "map" . }}
{{- range $k, $_ := . }}
{{- if has $k $known }}
{{- fail (printf "config.hosts.%s is set by the chart: use hosts.timeouts.%s instead" $k $k) }}
{{- end }}
{{- if eq $k "tls_names" }}
{{- fail "config.hosts.tls_names is set by the chart: use hosts.tls.names instead" }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- if $v.operators }}
{{- if $v.existingSecret }}
{{- fail (printf "existingSecret %q is set: leave operators empty and put SWITCHYARD_OPERATOR_TOKENS (name=token,name=token) in that Secret" $v.existingSecret) }}
{{- end }}
{{- if hasKey ($v.extraSecretEnv | default dict) "SWITCHYARD_OPERATOR_TOKENS" }}
{{- fail "extraSecretEnv.SWITCHYARD_OPERATOR_TOKENS and operators are both set: use operators only" }}
{{- end }}
{{- $seen := list }}
{{- range $i, $op := $v.operators }}
{{- if not (and (kindIs "map" $op) (kindIs "string" $op.name) (kindIs "string" $op.token)) }}
{{- fail (printf "operators[%d] must be {name: NAME, token: TOKEN} with both as strings (quote a token made of digits)" $i) }}
{{- end }}
{{- if not (regexMatch "^[^=,\\s]+$" $op.name) }}
{{- fail (printf "operators[%d].name %q must be non-empty, without '=', ',' or spaces" $i $op.name) }}
{{- end }}
{{- $hex := regexMatch "^[0-9A-Fa-f]{32,}$" $op.token }}
{{- $b64 := and (regexMatch "^[A-Za-z0-9+/_-]{22,}={0,2}$" $op.token) (regexMatch "[A-Z]" $op.token) (regexMatch "[a-z]" $op.token) (regexMatch "[0-9]" $op.token) }}
{{- if not (or $hex $b64) }}
{{- fail (printf "operators[%d] (%s): the token needs 128+ bits of randomness: 32+ hex characters or 22+ base64 ones, e.g. from `openssl rand -hex 32`" $i $op.name) }}
{{- end }}
{{- if has $op.name $seen }}
{{- fail (printf "operators: the name %q appears twice" $op.name) }}
{{- end }}
{{- $seen = append $seen $op.name }}
{{- end }}
{{- end }}
{{- end }}

{{/*
SWITCHYARD_PUBLIC_BASE_URL: publicBaseUrl, else the first ingress host (https when listed
under ingress.tls), else the first HTTPRoute hostname (https).
*/}}
{{- define "switchyard.publicBaseUrl" -}}
{{- if .Values.publicBaseUrl }}
{{- trimSuffix "/" .Values.publicBaseUrl }}
{{- else if and .Values.ingress.enabled .Values.ingress.hosts (first .Values.ingress.hosts).host }}
{{- $host := (first .Values.ingress.hosts).host }}
{{- $tls := false }}
{{- range .Values.ingress.tls }}
{{- if has $host (.hosts | default list) }}
{{- $tls = true }}
{{- end }}
{{- end }}
{{- printf "%s://%s" (ternary "https" "http" $tls) $host }}
{{- else if and .Values.httpRoute.enabled .Values.httpRoute.hostnames }}
{{- printf "https://%s" (first .Values.httpRoute.hostnames) }}
{{- end }}
{{- end }}

{{/*
Fails rendering with a clear message when the clustered mode is not fully configured.
Included by every template that starts a Switchyard process.
*/}}
{{- define "switchyard.validate" -}}
{{- $v := .Values }}
{{- /* Every missing required value, named at once (values.schema.json does the same). */}}
{{- $missing := list }}
{{- if $v.existingSecret }}
{{- if or $v.database.url $v.keys.signing $v.keys.encryption $v.s3.accessKeyId $v.s3.secretAccessKey $v.s3.sessionToken }}
{{- fail (printf "existingSecret %q is set: leave database.url, keys.*, s3.accessKeyId, s3.secretAccessKey and s3.sessionToken empty and put SWITCHYARD_DATABASE_URL, SWITCHYARD_SIGNING_KEYS, SWITCHYARD_ENCRYPTION_KEYS, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in that Secret" $v.existingSecret) }}
{{- end }}
{{- else }}
{{- if not $v.database.url }}
{{- $missing = append $missing "database.url (postgres://USER:PASSWORD@HOST:5432/DB; this chart runs the clustered mode only)" }}
{{- end }}
{{- if not $v.keys.signing }}
{{- $missing = append $missing "keys.signing (comma-separated; `openssl rand -hex 32`)" }}
{{- end }}
{{- if not $v.keys.encryption }}
{{- $missing = append $missing "keys.encryption (comma-separated base64 32-byte keys; `openssl rand -base64 32`)" }}
{{- end }}
{{- if not $v.s3.accessKeyId }}
{{- $missing = append $missing "s3.accessKeyId (Switchyard reads AWS credentials from the environment only)" }}
{{- end }}
{{- if not $v.s3.secretAccessKey }}
{{- $missing = append $missing "s3.secretAccessKey" }}
{{- end }}
{{- end }}
{{- if not $v.nats.url }}
{{- $missing = append $missing "nats.url (e.g. nats://nats:4222)" }}
{{- end }}
{{- if not $v.redis.url }}
{{- $missing = append $missing "redis.url (e.g. redis://redis-master:6379)" }}
{{- end }}
{{- if not $v.s3.bucket }}
{{- $missing = append $missing "s3.bucket" }}
{{- end }}
{{- $base := include "switchyard.publicBaseUrl" . }}
{{- if not $base }}
{{- $missing = append $missing "publicBaseUrl (e.g. https://connectors.example.com), or an ingress host or httpRoute hostname" }}
{{- end }}
{{- if $missing }}
{{- fail (printf "\n%d required values are missing (the secret ones may come from existingSecret instead):\n  - %s" (len $missing) (join "\n  - " $missing)) }}
{{- end }}
{{- if and (not $v.existingSecret) (not (regexMatch "^postgres(ql)?://" $v.database.url)) }}
{{- fail "database.url must be a Postgres URL (postgres://...): the clustered mode does not run on SQLite" }}
{{- end }}
{{- if not $v.existingSecret }}
{{- range splitList "," $v.keys.encryption }}
{{- $k := trim . }}
{{- if and $k (not (regexMatch "^[A-Za-z0-9+/]{43}=$" $k)) }}
{{- fail "keys.encryption: every key must be 32 bytes in standard base64 (44 characters ending in '='), e.g. from `openssl rand -base64 32`" }}
{{- end }}
{{- end }}
{{- end }}
{{- if not (regexMatch "^https?://[^/]+" $base) }}
{{- fail (printf "publicBaseUrl %q must be an absolute http:// or https:// URL" $base) }}
{{- end }}
{{- if lt (int $v.replicaCount) 1 }}
{{- fail "replicaCount must be at least 1" }}
{{- end }}
{{- $owned := list "listen" "metrics_listen" "data_dir" "database_url" "database_schema" "database_max_connections" "nats_url" "nats_subject_prefix" "redis_url" "redis_key_prefix" "s3" "pod_id" "public_base_url" "signing_keys" "encryption_keys" "drain_timeout" "log" "hosts_tls_listen" "hosts_ca_cert" "hosts_ca_key" "hosts_client_cert_header" "hosts_ingress_secret" "hosts_ingress_sources" "admin_listen" "operator_tokens" }}
{{- range $k, $_ := $v.config }}
{{- if has $k $owned }}
{{- fail (printf "config.%s is set by the chart: use its dedicated value in values.yaml instead" $k) }}
{{- end }}
{{- end }}
{{- $_ := include "switchyard.terminationGracePeriodSeconds" . }}
{{- $_ := include "switchyard.validateHosts" . }}
{{- if and .Values.httpRoute.enabled (not .Values.httpRoute.parentRefs) }}
{{- fail "httpRoute.enabled needs httpRoute.parentRefs (the Gateway to attach to)" }}
{{- end }}
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
SWITCHYARD_ADMIN_LISTEN: {{ printf "0.0.0.0:%d" (int .Values.containerPorts.admin) | quote }}
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
{{- if .Values.hosts.enabled }}
SWITCHYARD_HOSTS_TLS_LISTEN: {{ printf "0.0.0.0:%d" (int .Values.hosts.tls.port) | quote }}
SWITCHYARD_HOSTS__TLS_NAMES: {{ include "switchyard.hostsTlsNames" . | quote }}
{{- else }}
SWITCHYARD_HOSTS_TLS_LISTEN: ""
{{- end }}
{{- if .Values.hosts.ca.existingSecret }}
SWITCHYARD_HOSTS_CA_CERT: {{ printf "%s/tls.crt" (include "switchyard.hostsCaDir" .) | quote }}
SWITCHYARD_HOSTS_CA_KEY: {{ printf "%s/tls.key" (include "switchyard.hostsCaDir" .) | quote }}
{{- end }}
{{- with .Values.hosts.clientCertHeader }}
SWITCHYARD_HOSTS_CLIENT_CERT_HEADER: {{ . | quote }}
{{- end }}
{{- with .Values.hosts.ingressProof.sources }}
SWITCHYARD_HOSTS_INGRESS_SOURCES: {{ join "," . | quote }}
{{- end }}
{{- range $k, $v := .Values.hosts.timeouts }}
SWITCHYARD_HOSTS__{{ upper $k }}: {{ include "switchyard.durationString" $v | quote }}
{{- end }}
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
{{- if .Values.operators }}
SWITCHYARD_OPERATOR_TOKENS: {{ include "switchyard.operatorTokens" . | b64enc | quote }}
{{- end }}
{{- with .Values.hosts.ingressProof.secret }}
SWITCHYARD_HOSTS_INGRESS_SECRET: {{ . | b64enc | quote }}
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
