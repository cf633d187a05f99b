{{/* The chart's name, and the objects' name: the release's when it names plugd. */}}
{{- define "plugd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "plugd.fullname" -}}
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

{{/* Labels of every object; the selector's are the pods' identity. */}}
{{- define "plugd.labels" -}}
{{ include "plugd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "plugd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "plugd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "plugd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "plugd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: with serviceAccount.create false, name the ServiceAccount plugd runs as" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image: repository@digest, else repository:tag (default appVersion). */}}
{{- define "plugd.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The kubelet's registry directory on the node. */}}
{{- define "plugd.registryDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubelet.rootDir) }}
{{- end }}

{{/* The caretaker's: its own name, so that no selector of the node agent's picks its pod. */}}
{{- define "plugd.caretakerSelectorLabels" -}}
app.kubernetes.io/name: {{ include "plugd.name" . }}-caretaker
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "plugd.caretakerLabels" -}}
{{ include "plugd.caretakerSelectorLabels" . }}
app.kubernetes.io/component: caretaker
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "plugd.caretakerServiceAccountName" -}}
{{- if .Values.caretaker.serviceAccountName }}
{{- .Values.caretaker.serviceAccountName }}
{{- else if .Values.serviceAccount.create }}
{{- printf "%s-caretaker" (include "plugd.fullname" . | trunc 53 | trimSuffix "-") }}
{{- else }}
{{- required "caretaker.serviceAccountName: with serviceAccount.create false, name the ServiceAccount the caretaker runs as (or set caretaker.enabled false)" .Values.caretaker.serviceAccountName }}
{{- end }}
{{- end }}

{{/* The Node condition types plugd writes, one a line: each expected
plugin's condition, or its default NAME/TYPEReady (kubenode's
DefaultCondition); NAME/Ready for a resource (an entry with anyOf). expect
in extraConfig wins, as in the ConfigMap. */}}
{{- define "plugd.conditionTypes" -}}
{{- $types := list }}
{{- range (dig "expect" .Values.expect .Values.extraConfig) }}
{{- $cond := .condition }}
{{- if not $cond }}
{{- $last := "" }}
{{- if not .anyOf }}{{ $last = last (splitList "/" (.type | default "" | toString)) }}{{ end }}
{{- $name := .name | default "" | toString }}
{{- if contains "/" $name }}{{ $cond = printf "%s-%sReady" $name $last }}{{ else }}{{ $cond = printf "%s/%sReady" $name $last }}{{ end }}
{{- end }}
{{- $types = append $types $cond }}
{{- end }}
{{- join "\n" ($types | uniq) }}
{{- end }}

{{/* "true" when the admission policies are rendered: admissionPolicy.enabled
and an API server that has them (admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy, Kubernetes 1.30 and later). Against a cluster
helm knows its kinds; helm template without one knows only versions (no
v1/ConfigMap), and goes by the Kubernetes version. */}}
{{- define "plugd.admissionPolicy" -}}
{{- $api := .Capabilities.APIVersions }}
{{- $has := or ($api.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (and (not ($api.Has "v1/ConfigMap")) (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version)) }}
{{- if and .Values.admissionPolicy.enabled $has }}true{{ end }}
{{- end }}

{{/* The taints plugd may add and remove, KEY:EFFECT, one a line:
kubernetes.removeTaintWhenReady and each expected plugin's taint (extraConfig
wins, as in the ConfigMap). Empty when there is none: then plugd gets no
"patch nodes". */}}
{{- define "plugd.taints" -}}
{{- $taints := list }}
{{- with (dig "kubernetes" "removeTaintWhenReady" .Values.kubernetes.removeTaintWhenReady .Values.extraConfig) }}{{ $taints = append $taints . }}{{ end }}
{{- range (dig "expect" .Values.expect .Values.extraConfig) }}{{ with .taint }}{{ $taints = append $taints . }}{{ end }}{{ end }}
{{- join "\n" ($taints | uniq) }}
{{- end }}

{{/* "true" when an expected plugin names deviceClasses (extraConfig wins, as
in the ConfigMap): then plugd reads DeviceClasses, and only then is it
granted "list, watch deviceclasses". */}}
{{- define "plugd.deviceClasses" -}}
{{- range (dig "expect" .Values.expect .Values.extraConfig) }}{{ if .deviceClasses }}true{{ end }}{{ end }}
{{- end }}
