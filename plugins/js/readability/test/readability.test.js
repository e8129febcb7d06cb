// Native tests of the plugin's logic (node --test), on the same module the
// component is built from.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { describe, evaluate, grade, resolve, syllables } from '../src/readability.js';

const trace = (message) => JSON.stringify({ schema_version: 1, trace_id: 't', output: { message }, steps: [{ result: { text: 'Go.' } }] });
const config = (c) => JSON.stringify({ target: 'output.message', max_grade: 8, ...c });

test('describe declares a valid id, a schema and no capability', () => {
  const info = describe();
  assert.equal(info.id, 'readability');
  assert.deepEqual(info.capabilities, []);
  const schema = JSON.parse(info.configSchema);
  assert.equal(schema.type, 'object');
  assert.equal(schema.properties.max_grade.default, 8);
});

test('syllables and grades follow the usual heuristics', () => {
  assert.equal(syllables('cat'), 1);
  assert.equal(syllables('table'), 2);
  assert.equal(syllables('readability'), 5);
  assert.ok(grade('The cat sat on the mat.').grade < 2);
  assert.ok(grade('Notwithstanding the aforementioned considerations, organizational responsibilities necessitate comprehensive institutional accountability.').grade > 16);
});

test('resolve reads dotted paths with indices', () => {
  const t = JSON.parse(trace('hi'));
  assert.equal(resolve(t, 'output.message'), 'hi');
  assert.equal(resolve(t, 'steps[0].result.text'), 'Go.');
  assert.equal(resolve(t, 'steps[1].result'), undefined);
  // Members every object inherits are not in the trace.
  for (const path of ['output.constructor', 'output.toString', 'output.__proto__', 'steps.map']) {
    assert.equal(resolve(t, path), undefined, path);
  }
});

test('evaluate passes plain text, fails dense text, and fails a missing target', () => {
  const [plain, missing] = evaluate(trace('Your refund is on its way. It takes three days.'), [
    config({}),
    config({ target: 'output.nope' }),
  ]);
  assert.equal(plain.tag, 'ok');
  assert.equal(plain.val.status, 'pass');
  const [dense] = evaluate(trace('Notwithstanding contractual considerations, reimbursement eligibility necessitates documentation.'), [config({})]);
  assert.equal(dense.val.status, 'fail');
  assert.match(dense.val.explanation, /above the maximum grade 8/);
  assert.ok(dense.val.score < 1);
  assert.equal(missing.val.status, 'fail');
  assert.match(missing.val.explanation, /output.nope could not be checked/);
});

test('a trace that is not JSON is unsupported for every config', () => {
  const out = evaluate('nope', [config({}), config({})]);
  assert.equal(out.length, 2);
  assert.equal(out[0].val.tag, 'unsupported-trace');
});
