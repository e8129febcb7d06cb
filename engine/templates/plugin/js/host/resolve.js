// Node module hook for `npm test`: the engine's imports, which only a
// component can have, resolve to the fake host in host/fake.js.
const ENGINE_IMPORT = /^attest:plugin\/(host|models|secrets)@\d+\.\d+\.\d+$/;

export async function resolve(specifier, context, next) {
  if (ENGINE_IMPORT.test(specifier)) {
    return { url: new URL('./fake.js', import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
