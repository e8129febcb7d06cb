import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describe, evaluate } from '../src/plugin.js';

const trace = JSON.stringify({ schema_version: 1, trace_id: 't', output: { message: 'Your REFUND is on its way.' } });

test('describe names the plugin and its schema', () => {
  const info = describe();
  assert.equal(info.id, '{{name}}');
  assert.deepEqual(JSON.parse(info.configSchema).required, ['phrase']);
});

test('passes when the phrase is there and fails when it is not', () => {
  const [ok, no, missing] = evaluate(trace, [
    JSON.stringify({ phrase: 'refund' }),
    JSON.stringify({ phrase: 'apology' }),
    JSON.stringify({ phrase: 'x', target: 'output.nope' }),
  ]);
  assert.equal(ok.val.status, 'pass');
  assert.equal(no.val.explanation, "output.message does not contain 'apology'.");
  assert.match(missing.val.explanation, /could not be checked/);
});

test('members every object inherits are not in the trace', () => {
  for (const target of ['output.constructor', 'output.toString', 'output.__proto__']) {
    const [r] = evaluate(trace, [JSON.stringify({ phrase: 'x', target })]);
    assert.equal(r.tag, 'ok', target);
    assert.match(r.val.explanation, /could not be checked/, target);
  }
});

test('an error inside the check is reported with its message', () => {
  const [r] = evaluate(trace, [JSON.stringify({ target: 'output.message' })]);
  assert.equal(r.val.tag, 'internal');
  assert.match(r.val.val, /^TypeError: /);
});

test("the engine's imports are served by the fake host in tests", async () => {
  // What src/plugin.js gets when it imports a capability, as in
  // `import { configSecret } from 'attest:plugin/secrets@0.2.0'`.
  const { configSecret } = await import('attest:plugin/secrets@0.2.0');
  const { fake } = await import('../host/fake.js');
  assert.throws(() => configSecret('api_token'), (e) => e.payload.tag === 'not-granted');
  fake.secrets = { api_token: 's3cret' };
  try {
    assert.equal(configSecret('api_token'), 's3cret');
    assert.equal(configSecret('other'), undefined);
  } finally {
    fake.secrets = null;
  }
});

test('a trace that is not JSON is unsupported', () => {
  assert.equal(evaluate('nope', ['{}'])[0].val.tag, 'unsupported-trace');
});
