// {{name}}: an attest-engine assertion plugin in JavaScript, built into a
// WebAssembly component with componentize-js against wit/ (attest:plugin@0.2.0).
// It passes when the target (by default output.message) contains `phrase`,
// ignoring case. Replace the check with yours; `npm test` runs the tests.
//
// componentize-js maps the WIT onto plain JavaScript: records are objects
// with lowerCamelCase fields, enums are strings, and each result in
// evaluate's list is {tag: 'ok' | 'err', val}. A throw would trap the call
// without a message, so evaluate catches everything.

const CONFIG_SCHEMA = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  title: '{{name}} config',
  type: 'object',
  additionalProperties: false,
  required: ['phrase'],
  properties: {
    target: {
      description: 'Where to look: a dotted path with [n] indices, such as output.message.',
      type: 'string',
      pattern: '^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z0-9_]+|\\[[0-9]+\\])*$',
      default: 'output.message',
    },
    phrase: { description: 'The phrase the target must contain.', type: 'string', minLength: 1 },
  },
};

export function describe() {
  return {
    id: '{{name}}',
    version: '0.1.0',
    description: 'Passes when a target contains a phrase, ignoring case.',
    configSchema: JSON.stringify(CONFIG_SCHEMA),
    capabilities: [],
  };
}

export function resolve(root, path) {
  let cur = root;
  for (const part of path.match(/[^.[\]]+|\[\d+\]/g) || []) {
    if (cur === null || typeof cur !== 'object') return undefined;
    const key = part.startsWith('[') ? Number(part.slice(1, -1)) : part;
    // Own members only: `in` would also find what every object inherits
    // (constructor, toString, __proto__).
    if (!Object.hasOwn(cur, key)) return undefined;
    cur = cur[key];
  }
  return cur;
}

function check(trace, config) {
  // The engine validated the config and filled in the schema's defaults.
  const target = config.target ?? 'output.message';
  const value = resolve(trace, target);
  if (value === undefined) {
    return { status: 'fail', score: 0, explanation: `${target} could not be checked: it is not in the trace.` };
  }
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  const found = text.toLowerCase().includes(config.phrase.toLowerCase());
  return {
    status: found ? 'pass' : 'fail',
    score: found ? 1 : 0,
    explanation: `${target} ${found ? 'contains' : 'does not contain'} '${config.phrase}'.`,
  };
}

export function evaluate(traceText, configs) {
  let trace;
  try {
    trace = JSON.parse(traceText);
  } catch (e) {
    return configs.map(() => ({ tag: 'err', val: { tag: 'unsupported-trace', val: `the trace is not JSON: ${e.message}` } }));
  }
  return configs.map((c) => {
    try {
      return { tag: 'ok', val: check(trace, JSON.parse(c)) };
    } catch (e) {
      // Inside the component a stack trace lacks the message: name it.
      return { tag: 'err', val: { tag: 'internal', val: e instanceof Error ? `${e.name}: ${e.message}` : String(e) } };
    }
  });
}
