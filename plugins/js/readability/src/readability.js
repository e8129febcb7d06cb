// readability: an attest-engine assertion plugin written in JavaScript,
// built into a WebAssembly component with componentize-js against
// wit/since_v0.2.0 (world assertion-plugin). It scores how hard a text is to
// read (the Flesch-Kincaid grade level) and fails when it is above the
// configured grade.
//
// componentize-js maps the WIT onto plain JavaScript: `describe` and
// `evaluate` are exported functions, records are objects with lowerCamelCase
// fields, enums are strings, and every `result` in evaluate's list is
// {tag: 'ok' | 'err', val}. A throw would trap the call without a message, so
// evaluate catches everything and answers `internal` instead.

const CONFIG_SCHEMA = {
  $schema: 'https://json-schema.org/draft/2020-12/schema',
  $id: 'https://attest.dev/plugins/readability/config.schema.json',
  title: 'readability config',
  description: 'Fails when a text reads above a Flesch-Kincaid grade level.',
  type: 'object',
  additionalProperties: false,
  properties: {
    target: {
      description: "The text to score: a dotted path with [n] indices, such as output.message or steps[0].result.text.",
      type: 'string',
      pattern: '^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z0-9_]+|\\[[0-9]+\\])*$',
      maxLength: 1024,
      default: 'output.message',
    },
    max_grade: {
      description: 'Highest Flesch-Kincaid grade level that passes (8: plain English; 12: a final-year school text).',
      type: 'number',
      minimum: 0,
      maximum: 30,
      default: 8,
    },
  },
};

export function describe() {
  return {
    id: 'readability',
    version: '0.1.0',
    description: 'Fails when a text reads above a Flesch-Kincaid grade level (a JavaScript plugin).',
    configSchema: JSON.stringify(CONFIG_SCHEMA),
    capabilities: [],
  };
}

/// The value at a dotted path with [n] indices, or undefined.
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

/// Syllables in one word: groups of vowels, less a silent final e.
export function syllables(word) {
  const w = word.toLowerCase().replace(/[^a-z]/g, '');
  if (w.length === 0) return 0;
  if (w.length <= 3) return 1;
  const groups = w.replace(/(?:[^laeiouy]es|ed|[^laeiouy]e)$/, '').replace(/^y/, '').match(/[aeiouy]{1,2}/g);
  return Math.max(1, groups ? groups.length : 1);
}

/// Words, sentences, syllables and the Flesch-Kincaid grade of a text.
export function grade(text) {
  const words = text.split(/\s+/).filter((w) => /[A-Za-z0-9]/.test(w));
  const sentences = Math.max(1, (text.match(/[.!?]+(\s|$)/g) || []).length);
  const syl = words.reduce((n, w) => n + syllables(w), 0);
  if (words.length === 0) return { words: 0, sentences, syllables: 0, grade: 0 };
  const g = 0.39 * (words.length / sentences) + 11.8 * (syl / words.length) - 15.59;
  return { words: words.length, sentences, syllables: syl, grade: Math.round(g * 10) / 10 };
}

function evaluateOne(trace, configText) {
  let config;
  try {
    config = JSON.parse(configText);
  } catch (e) {
    return { tag: 'err', val: { tag: 'invalid-config', val: `config is not JSON: ${e.message}` } };
  }
  // The engine filled in the schema's defaults and validated the config.
  const target = config.target;
  const maxGrade = config.max_grade;
  const value = resolve(trace, target);
  if (value === undefined || value === null) {
    return {
      tag: 'ok',
      val: {
        status: 'fail',
        score: 0,
        explanation: `${target} could not be checked: it is not in the trace.`,
        details: JSON.stringify({ expected: `text at ${target}`, actual: 'not found', path: target }),
      },
    };
  }
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  const r = grade(text);
  const passed = r.grade <= maxGrade;
  const score = passed ? 1 : Math.max(0, Math.min(1, 1 - (r.grade - maxGrade) / 10));
  return {
    tag: 'ok',
    val: {
      status: passed ? 'pass' : 'fail',
      score,
      explanation:
        `${target} reads at grade ${r.grade} (Flesch-Kincaid: ${r.words} words, ${r.sentences} sentences, ` +
        `${r.syllables} syllables), ${passed ? 'within' : 'above'} the maximum grade ${maxGrade}.`,
      details: JSON.stringify({
        expected: `grade ≤ ${maxGrade}`,
        actual: `grade ${r.grade}`,
        path: target,
        hint: passed ? undefined : 'Use shorter sentences and simpler words, or raise max_grade.',
      }),
    },
  };
}

export function evaluate(traceText, configs) {
  let trace;
  try {
    trace = JSON.parse(traceText);
  } catch (e) {
    const err = { tag: 'err', val: { tag: 'unsupported-trace', val: `the trace is not JSON: ${e.message}` } };
    return configs.map(() => err);
  }
  return configs.map((c) => {
    try {
      return evaluateOne(trace, c);
    } catch (e) {
      // Inside the component a stack trace lacks the message: name it.
      return { tag: 'err', val: { tag: 'internal', val: e instanceof Error ? `${e.name}: ${e.message}` : String(e) } };
    }
  });
}
