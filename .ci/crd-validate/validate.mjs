// Validates custom resources, one JSON object per line on stdin, against the schemas that
// @kubernetes-models generates from the prometheus-operator and cert-manager API types (types,
// required fields, enums, patterns). Prints one line per object; exits 1 if any is invalid or of a
// kind it does not know.
import { createInterface } from "node:readline";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";
import { Certificate } from "@kubernetes-models/cert-manager/cert-manager.io/v1/Certificate";

const models = {
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
  "monitoring.coreos.com/v1/PrometheusRule": PrometheusRule,
  "cert-manager.io/v1/Certificate": Certificate,
};

let failed = false;
for await (const line of createInterface({ input: process.stdin })) {
  if (!line.trim()) continue;
  const object = JSON.parse(line);
  const kind = `${object.apiVersion}/${object.kind}`;
  const name = `${object.kind.toLowerCase()}/${object.metadata?.name}`;
  const Model = models[kind];
  if (!Model) {
    console.log(`ERROR ${name}: no schema for ${kind}`);
    failed = true;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`INFO ${name} passed against the ${kind} schema`);
  } catch (e) {
    console.log(`ERROR ${name} did not validate against the ${kind} schema: ${e.message}`);
    failed = true;
  }
}
process.exit(failed ? 1 : 0);
