// validate-k8s.mjs - validates rendered manifests (kubectl kustomize output, multi-document
// YAML on stdin) against the Kubernetes, Knative, KEDA and Prometheus-operator schemas
// (kubernetes-models packages), then checks the production rules of README "Deploying on
// Kubernetes". Usage: kubectl kustomize k8s/overlays/X | node validate-k8s.mjs X PIPELINES_DIR
// Prints one line per object and exits 1 naming every violation.
import { readFileSync, readdirSync } from "node:fs";
import { parseAllDocuments } from "yaml";

const [overlay, pipelinesDir] = process.argv.slice(2);
const docs = parseAllDocuments(readFileSync(0, "utf8")).map((d) => d.toJS()).filter(Boolean);
const problems = [];
const bad = (obj, msg) => problems.push(`${obj.kind}/${obj.metadata?.name}: ${msg}`);

function modelModule(apiVersion) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group.endsWith("knative.dev")) return `@kubernetes-models/knative/${group}/${version}`;
  if (group === "keda.sh" || group === "eventing.keda.sh") return `@kubernetes-models/keda/${group}/${version}`;
  if (group === "monitoring.coreos.com") return `@kubernetes-models/prometheus-operator/${group}/${version}`;
  return group ? `kubernetes-models/${group}/${version}` : `kubernetes-models/${version}`;
}

for (const obj of docs) {
  let Model;
  try {
    Model = (await import(modelModule(obj.apiVersion)))[obj.kind];
  } catch (e) {
    Model = undefined;
  }
  if (!Model) {
    bad(obj, `no schema for ${obj.apiVersion} ${obj.kind}`);
    continue;
  }
  // kustomize wraps long base64 values at 76 columns; the API server's decoder skips the
  // newlines, the schema's "byte" format does not: compare them unwrapped
  if (obj.kind === "Secret" && obj.data)
    obj.data = Object.fromEntries(Object.entries(obj.data).map(([k, v]) => [k, String(v).replace(/\s+/g, "")]));
  try {
    new Model(obj).validate();
    console.log(`ok ${obj.apiVersion} ${obj.kind}/${obj.metadata.name}`);
  } catch (e) {
    bad(obj, `schema: ${e.message}`);
  }
}

// ---- production rules ----------------------------------------------------------------------
const byKind = (k) => docs.filter((o) => o.kind === k);
const env = Object.assign({}, ...byKind("ConfigMap").filter((c) => c.metadata.name === "outboxd").map((c) => c.data));
const graceS = parseInt(env.SHUTDOWN_GRACE ?? "20s", 10);
for (const ns of byKind("Namespace")) if (ns.metadata.name !== "outboxd") bad(ns, "unexpected namespace");
for (const sa of byKind("ServiceAccount")) if (sa.automountServiceAccountToken !== false) bad(sa, "token automounted");
for (const d of byKind("Deployment")) {
  const pod = d.spec.template.spec;
  if (d.metadata.namespace !== "outboxd") bad(d, "not in namespace outboxd");
  if (pod.automountServiceAccountToken !== false) bad(d, "service account token mounted");
  if (!pod.securityContext?.runAsNonRoot) bad(d, "runAsNonRoot missing");
  if (pod.securityContext?.seccompProfile?.type !== "RuntimeDefault") bad(d, "seccomp is not RuntimeDefault");
  if (!pod.topologySpreadConstraints?.length) bad(d, "no topology spread");
  for (const c of pod.containers) {
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false) bad(d, "privilege escalation allowed");
    if (sc.readOnlyRootFilesystem !== true) bad(d, "root filesystem writable");
    if (!(sc.capabilities?.drop ?? []).includes("ALL")) bad(d, "capabilities not all dropped");
    if (!c.startupProbe || !c.readinessProbe || !c.livenessProbe) bad(d, "startup, readiness and liveness probes required");
    if (!c.resources?.requests?.cpu || !c.resources?.limits?.memory) bad(d, "requests and a memory limit required");
    if (!/:[0-9]+\.[0-9]+\.[0-9]+$/.test(c.image)) bad(d, `image ${c.image} is not pinned to a version`);
    const preStop = c.lifecycle?.preStop?.sleep?.seconds ?? 0;
    if (!(pod.terminationGracePeriodSeconds > preStop + graceS))
      bad(d, `terminationGracePeriodSeconds ${pod.terminationGracePeriodSeconds} <= preStop ${preStop} + SHUTDOWN_GRACE ${graceS}`);
  }
  const pdb = byKind("PodDisruptionBudget").find((p) =>
    Object.entries(p.spec.selector.matchLabels).every(([k, v]) => d.spec.selector.matchLabels[k] === v));
  if (!pdb) bad(d, "no PodDisruptionBudget");
}
if (!byKind("HorizontalPodAutoscaler").some((h) => h.spec.scaleTargetRef.name === "outboxd-api")) problems.push("no HPA for the api");
if (!byKind("ServiceMonitor").length || !byKind("PrometheusRule").length) problems.push("no ServiceMonitor / PrometheusRule");
const alerts = byKind("PrometheusRule").flatMap((r) => r.spec.groups.flatMap((g) => g.rules.map((x) => x.expr)));
for (const series of ["outboxd_relay_leader", "outboxd_worker_consumer_lag", "outboxd_worker_dlq_published_total",
  "outboxd_relay_failed_total", "outboxd_parked_keys_oldest_age_seconds"])
  if (!alerts.some((e) => e.includes(series))) problems.push(`no alert on ${series}`);
if (!byKind("NetworkPolicy").some((p) => Object.keys(p.spec.podSelector).length === 0)) problems.push("no default-deny NetworkPolicy");

const worker = byKind("Deployment").find((d) => d.metadata.name === "outboxd-worker");
const source = worker?.spec.template.spec.containers[0].env?.find((e) => e.name === "WORKER_SOURCE")?.value;
if (overlay === "kafka-worker") {
  if (source !== "kafka") problems.push("kafka-worker: WORKER_SOURCE is not kafka");
  if (!byKind("ScaledObject").some((s) => s.spec.triggers.some((t) => t.type === "kafka"))) problems.push("no KEDA ScaledObject on Kafka lag");
  if (byKind("Trigger").length) problems.push("kafka-worker must not route through Knative");
}
if (overlay === "knative-worker") {
  if (source !== "http") problems.push("knative-worker: WORKER_SOURCE is not http");
  const broker = byKind("Broker")[0];
  if (broker?.metadata.annotations?.["eventing.knative.dev/broker.class"] !== "Kafka") problems.push("no Kafka-class Broker");
  const sink = byKind("Service").find((s) => s.metadata.name === "outboxd-sink");
  if (!sink || (sink.spec.type ?? "ClusterIP") !== "ClusterIP") problems.push("the sink Service is not cluster-local");
  // every event type a pipeline consumes has an ordered Trigger with retries and a dead-letter sink into the DLQ
  const types = readdirSync(pipelinesDir).filter((f) => f.endsWith(".json")).map((f) => {
    const t = JSON.parse(readFileSync(`${pipelinesDir}/${f}`, "utf8")).trigger;
    return t === "order.post" ? "OrderConfirmed" : t.startsWith("event.") ? t.slice(6) : null;
  }).filter(Boolean);
  for (const type of types) {
    const tr = byKind("Trigger").find((t) => t.spec.filter?.attributes?.type === type);
    if (!tr) { problems.push(`no Trigger for ${type}`); continue; }
    if (tr.metadata.annotations?.["kafka.eventing.knative.dev/delivery.order"] !== "ordered") bad(tr, "delivery not ordered");
    if (!(tr.spec.delivery?.retry >= 10)) bad(tr, "retry budget under 10 attempts");
    if (!tr.spec.delivery?.deadLetterSink?.uri?.endsWith("/dead-letter")) bad(tr, "deadLetterSink is not the sink's /dead-letter");
    if (!/^http:\/\/[^@]+@outboxd-sink\.outboxd\.svc\.cluster\.local\//.test(tr.spec.subscriber?.uri ?? "")) bad(tr, "subscriber is not the cluster-local sink with credentials");
  }
}
for (const p of problems) console.log(`PROBLEM ${p}`);
console.log(`${overlay}: ${docs.length} objects, ${problems.length} problems`);
process.exit(problems.length ? 1 : 0);
