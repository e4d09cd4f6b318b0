'use strict';
// A Node client of the laya-grpc gateway, written as an agent developer would write one: the
// contract loaded from protos/ with @grpc/proto-loader, requests and answers read through their
// typed fields (no JSON inside strings). It calls Decide (every question type), DecideBatch,
// DecideStream (answers and a per-call error), a failing Decide, grpc.health.v1 Check and Watch,
// and StatusService GetStatus and Watch, and prints what it read as one JSON object on stdout.
// tests/test_node_client.py starts a real stack, runs this script, and compares every value with
// the HTTP route's answer to the same request.
//
//   node tests/node/client_test.js HOST:PORT [API_KEY]

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const [address, apiKey] = process.argv.slice(2);
const ROOT = path.resolve(__dirname, '..', '..');
const LOAD = { keepCase: true, longs: String, enums: String, defaults: false, oneofs: true };

const laya = grpc.loadPackageDefinition(protoLoader.loadSync('laya_proto/v1/decision.proto', {
  ...LOAD, includeDirs: [path.join(ROOT, 'protos')],
})).laya_proto.v1;
const health = grpc.loadPackageDefinition(protoLoader.loadSync(
  path.join(__dirname, 'node_modules', 'grpc-health-check', 'proto', 'health', 'v1', 'health.proto'), LOAD,
)).grpc.health.v1;

const creds = grpc.credentials.createInsecure();
const decisions = new laya.DecisionService(address, creds);
const status = new laya.StatusService(address, creds);
const healthClient = new health.Health(address, creds);

function metadata() {
  const md = new grpc.Metadata();
  if (apiKey) md.add('authorization', 'Bearer ' + apiKey);
  return md;
}

const deadline = () => ({ deadline: Date.now() + 60000 });
const unary = (client, method, req) => new Promise((resolve, reject) => {
  client[method](req, metadata(), deadline(), (err, resp) => (err ? reject(err) : resolve(resp)));
});

// -- requests, typed -------------------------------------------------------------------------
const STATE = 'I was charged twice for my order. Please refund the duplicate today.';
const QUESTIONS = [
  {
    id: 'dept', type: 'QUESTION_TYPE_CHOICE', instructions_text: 'Which department should handle this?',
    criteria: [
      { label: { string_value: 'billing' }, description: 'charges, invoices and refunds' },
      { label: { string_value: 'technical' } },
      { label: { string_value: 'other' } },
    ],
  },
  {
    id: 'pick', type: 'QUESTION_TYPE_CHOICE', instructions_text: 'Pick one',
    criteria: [{ label: { int_value: '1' } }, { label: { number_value: 2.5 } }, { label: { bool_value: false } },
      { label: { string_value: 'x' } }],
  },
  {
    id: 'urgency', type: 'QUESTION_TYPE_SCORE', instructions_text: 'How urgent is it?',
    criteria: [{ description: 'not urgent' }, { description: 'soon' }, { description: 'right now' }],
  },
  {
    id: 'refund', type: 'QUESTION_TYPE_NOUL', instructions_text: 'Does the customer ask for a refund?',
    criteria: [{ label: { bool_value: true }, description: 'asks for money back' }],
    labels: { false_label: 'no', true_label: 'yes' },
  },
];
const DECIDE = { state: { text: STATE }, questions: QUESTIONS, model: 'english', min_confidence_all: 0.5 };
const BATCH = {
  states: [{ text: STATE }, { json: JSON.stringify({ subject: 'login', body: 'cannot login, getting 500 error' }) }],
  questions: QUESTIONS, model: 'english',
};
const BAD_MODEL = { state: { text: STATE }, questions: [QUESTIONS[3]], model: 'org/repo' };
const CONFLICT = { state: { text: STATE }, request_json: '{"state": "x", "questions": {}}' };

// -- answers, read through typed fields -------------------------------------------------------
function labelValue(label) {
  switch (label.value) {
    case 'string_value': return label.string_value;
    case 'int_value': return Number(label.int_value);
    case 'number_value': return label.number_value;
    case 'bool_value': return label.bool_value;
    default: throw new Error('label without a value');
  }
}

function answerView(a) {
  const v = { id: a.id, type: a.type, answer: a.answer, present: ['choice', 'score', 'noul'].filter((k) => a[k] != null) };
  if (a.answer === 'choice') {
    v.choice = labelValue(a.choice.choice);
    v.choice_kind = a.choice.choice.value;
    v.probabilities = (a.choice.probabilities || []).map((p) => [labelValue(p.label), p.label.value, p.probability ?? 0]);
    if (a.choice.x_jev_confidence != null) v.x_jev_confidence = a.choice.x_jev_confidence;
  } else if (a.answer === 'score') {
    v.score = a.score.score ?? 0;
    v.legend = a.score.legend || [];
    v.probabilities = a.score.probabilities || [];
    if (a.score.x_jev_confidence != null) v.x_jev_confidence = a.score.x_jev_confidence;
  } else {
    v.noul = a.noul.noul ?? 0;
  }
  for (const k of ['confidence', 'answer_confidence', 'low_confidence', 'abstention_threshold']) {
    if (a[k] != null) v[k] = a[k];
  }
  if (a.action != null) v.act_probability = a.action.act_probability ?? 0;
  v.abstention = a.abstention || 'ABSTENTION_UNSPECIFIED';
  return v;
}

function responseView(r) {
  return {
    model: r.model,
    answers: (r.answers || []).map(answerView),
    usage: { input_tokens: r.usage.input_tokens ?? 0, output_tokens: r.usage.output_tokens ?? 0,
      state_tokens: r.usage.state_tokens ?? null, truncated: r.usage.truncated ?? null },
    routing: r.routing ? { model: r.routing.model, reason: r.routing.reason, repo: r.routing.repo ?? null } : null,
    has_json: r.json != null,
  };
}

const errorView = (err) => ({
  code: err.code,
  details: err.details,
  kind: (err.metadata.get('laya-error-kind') || [])[0] || null,
  has_status_details: err.metadata.get('grpc-status-details-bin').length > 0,
});

// -- streams ----------------------------------------------------------------------------------
function decideStream(calls) {
  return new Promise((resolve, reject) => {
    const stream = decisions.DecideStream(metadata());
    const replies = {};
    stream.on('data', (reply) => {
      replies[reply.id] = reply.result === 'error' ? { error: reply.error } : { response: responseView(reply.response) };
      if (Object.keys(replies).length === calls.length) stream.end();
    });
    stream.on('error', reject);
    stream.on('end', () => resolve(replies));
    calls.forEach((request, i) => stream.write({ id: String(i + 1), request }));
  });
}

function firstOf(call) {
  return new Promise((resolve, reject) => {
    call.on('data', (msg) => { resolve(msg); call.cancel(); });
    call.on('error', (err) => { if (err.code !== grpc.status.CANCELLED) reject(err); });
  });
}

async function main() {
  const out = {};
  out.decide = responseView(await unary(decisions, 'Decide', DECIDE));
  const withJson = await unary(decisions, 'Decide', { ...DECIDE, include_json: true });
  out.decide_json = withJson.json;
  const batch = await unary(decisions, 'DecideBatch', BATCH);
  out.batch = {
    results: batch.results.map(responseView),
    total_usage: { input_tokens: batch.total_usage.input_tokens ?? 0, output_tokens: batch.total_usage.output_tokens ?? 0 },
  };
  out.stream = await decideStream([DECIDE, BAD_MODEL, { ...DECIDE, questions: [QUESTIONS[2]] }]);
  out.errors = {};
  for (const [name, req] of [['bad_model', BAD_MODEL], ['conflict', CONFLICT]]) {
    try {
      await unary(decisions, 'Decide', req);
      out.errors[name] = null;
    } catch (err) {
      out.errors[name] = errorView(err);
    }
  }
  out.health_check = (await unary(healthClient, 'Check', { service: '' })).status;
  out.health_check_decisions = (await unary(healthClient, 'Check', { service: 'laya_proto.v1.DecisionService' })).status;
  out.health_watch = (await firstOf(healthClient.Watch({ service: '' }, metadata()))).status;
  const st = await unary(status, 'GetStatus', {});
  out.status = { ready: st.ready, reason: st.reason, services: st.services.map((s) => [s.service, s.state]) };
  out.status_watch = (await firstOf(status.Watch({ heartbeat_s: 1 }, metadata()))).reason;
  process.stdout.write(JSON.stringify(out) + '\n');
  for (const c of [decisions, status, healthClient]) c.close();
}

main().catch((err) => {
  process.stderr.write('node client failed: ' + (err && err.stack ? err.stack : err) + '\n');
  process.exit(1);
});
