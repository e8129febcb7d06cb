// A fake of the engine's host interfaces (attest:plugin/host, models and
// secrets @0.2.0), for `npm test`, which runs src/plugin.js in Node rather
// than in the engine. host/resolve.js points those imports here. Tests set
// what the fake answers through `fake`; a capability left at null answers
// `not-granted`, as the engine does for a capability the operator did not
// grant. Failed calls throw with the capability-error in `e.payload`, the
// shape componentize-js gives the built component.

export const fake = {
  // config-secret: name -> value; a missing name reads as undefined
  // (not mapped). null: not granted.
  secrets: null,
  // embed: (texts) => vectors, one array of numbers per text. null: not granted.
  embed: null,
  // judge: ({rubric, content, context, examples}) => ({score, reasoning}). null: not granted.
  judge: null,
  // Every host.log call, as [level, message].
  logs: [],
};

function notGranted(capability) {
  const error = new Error(`capability '${capability}' is not granted (the fake host in host/fake.js)`);
  error.payload = {
    tag: 'not-granted',
    val: { capability, configKey: 'plugins[].grants', message: error.message },
  };
  return error;
}

export function log(level, message) {
  fake.logs.push([level, message]);
}

export function configSecret(name) {
  if (fake.secrets === null) throw notGranted('config-secret');
  return Object.hasOwn(fake.secrets, name) ? fake.secrets[name] : undefined;
}

export function embed(texts) {
  if (fake.embed === null) throw notGranted('embed');
  return fake.embed(texts);
}

export function judge(request) {
  if (fake.judge === null) throw notGranted('judge');
  return fake.judge(request);
}
