// Loaded by `npm test` (node --import): installs host/resolve.js.
import { register } from 'node:module';

register('./resolve.js', import.meta.url);
