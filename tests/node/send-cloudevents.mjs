// send-cloudevents.mjs - posts two OrderConfirmed events built by the official CloudEvents SDK
// to outboxd's sink: one in binary mode, one in structured mode (test_worker_http).
// Env: SINK_URL, SINK_TOKEN, EVENT_ORG, EVENT_IDS ("<binary id>,<structured id>").
// Prints "<mode> <status> <body>" per event; exits 1 when either is not 200.
import { CloudEvent, HTTP } from "cloudevents";

const [binaryId, structuredId] = process.env.EVENT_IDS.split(",");
const sends = [
  ["binary", HTTP.binary, binaryId, "SDK-B"],
  ["structured", HTTP.structured, structuredId, "SDK-S"],
];
let failed = false;
for (const [mode, encode, id, number] of sends) {
  const event = new CloudEvent({
    specversion: "1.0",
    id,
    type: "OrderConfirmed",
    source: "/test/sdk",
    subject: `Order/${number}`,
    partitionkey: number,
    orgid: process.env.EVENT_ORG,
    datacontenttype: "application/json",
    data: { orderNumber: number },
  });
  const message = encode(event);
  const res = await fetch(process.env.SINK_URL, {
    method: "POST",
    headers: { ...message.headers, Authorization: `Bearer ${process.env.SINK_TOKEN}` },
    body: typeof message.body === "string" ? message.body : JSON.stringify(message.body),
  });
  const text = await res.text();
  console.log(`${mode} ${res.status} ${text}`);
  if (res.status !== 200) failed = true;
}
process.exit(failed ? 1 : 0);
