// Drives `attest-engine view` in Debian's headless Chromium with
// playwright-core, over a history tests/integration/viewer.rs filled through
// the real binary. VIEWER_EXPECT holds the store's own numbers.
import assert from 'node:assert/strict';

const { chromium } = await import(process.env.PLAYWRIGHT_CORE);
const base = process.env.VIEWER_URL;
const expect = JSON.parse(process.env.VIEWER_EXPECT);
const shots = process.env.VIEWER_SCREENSHOTS;

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const page = await browser.newPage({ viewport: { width: 1300, height: 1000 } });
// Nothing on any page may run script or ask for anything beyond the viewer.
const dialogs = [];
page.on('dialog', (d) => { dialogs.push(d.message()); d.dismiss(); });
const offsite = [];
page.on('request', (r) => { if (!r.url().startsWith(base)) offsite.push(r.url()); });
const errors = [];
page.on('pageerror', (e) => errors.push(String(e)));

const num = async (sel) => Number((await page.textContent(sel)).trim());
const shot = (name, fullPage = true) => page.screenshot({ path: `${shots}/${name}.png`, fullPage });
const step = (what) => console.log(`ok: ${what}`);

// Overview: the numbers equal the store's.
let r = await page.goto(`${base}/`);
assert.equal(r.status(), 200);
assert.equal(await num('#stat-results'), expect.results);
assert.equal(await num('#stat-pass') + await num('#stat-soft') + await num('#stat-fail'), expect.results);
assert.equal(await num('#stat-runs'), expect.runs);
assert.equal(await num('#stat-kept'), expect.kept);
assert.ok(await num('#stat-drifting') >= 1, 'the drifting assertion is counted');
// Every chart has words, and status is never colour alone.
for (const svg of await page.$$('svg')) {
  assert.equal(await svg.getAttribute('role'), 'img');
  assert.ok((await svg.getAttribute('aria-label')).length > 10);
}
assert.ok((await page.textContent('table.assertions')).includes('✗ hard_fail'));
await shot('overview');
step('overview numbers equal the store');

// Keyboard: the first Tab reaches the skip link, and Enter in the search
// box filters.
await page.keyboard.press('Tab');
assert.equal(await page.evaluate(() => document.activeElement.textContent), 'Skip to content');
await page.focus('#q');
await page.keyboard.type('drifty');
await page.keyboard.press('Enter');
await page.waitForURL(/q=drifty/);
let rows = await page.$$('table.assertions tbody tr');
assert.equal(rows.length, 1);
assert.match(await page.textContent('#matched'), /^1 of /);
step('search by keyboard');

// Status filter and sorting.
await page.goto(`${base}/?status=failing`);
const failingNames = await page.$$eval('table.assertions tbody th a', (as) => as.map((a) => a.textContent));
assert.ok(failingNames.includes('tone'), failingNames.join(','));
const latest = await page.$$eval('table.assertions tbody tr td:nth-of-type(2)', (tds) => tds.map((t) => t.textContent));
assert.ok(latest.length >= 1 && latest.every((t) => !t.includes('✓ pass')), latest.join('|'));
await page.click('thead a:has-text("Pass rate")');
const rates = await page.$$eval('td.pass-rate', (tds) => tds.map((t) => parseFloat(t.textContent)));
assert.deepEqual(rates, [...rates].sort((a, b) => a - b));
assert.equal(await page.getAttribute('th[aria-sort]', 'aria-sort'), 'ascending');
step('filter and sort');

// Drill down: overview → the assertion → its failing evaluation.
await page.goto(`${base}/`);
await page.click('table.assertions a:text-is("drifty")');
await page.waitForURL(/\/assertion\/\d+/);
assert.equal(await num('#a-total'), expect.drifty.total);
assert.equal(await num('#a-pass'), expect.drifty.pass);
assert.equal(await num('#a-fail'), expect.drifty.fail);
assert.match(await page.textContent('#drift'), /drift detected/);
assert.ok((await page.$$('#h-alerts ~ table tbody tr')).length >= 1, 'drift alerts listed');
await shot('assertion');
step('assertion page');

await page.goto(`${base}/`);
await page.click('table.assertions a:text-is("tone")');
assert.equal(await num('#a-total'), expect.tone.total);
assert.equal(await num('#a-fail'), expect.tone.fail);
await page.click('ol.failures a:has-text("open the evaluation")');
await page.waitForURL(/\/evaluation\/\d+/);
const body = await page.textContent('main');
// Hostile content is shown as text and ran nothing.
assert.ok(body.includes("<script>document.title='pwned'</script>"), 'script tag shown as text');
assert.ok(body.includes('<img src=x onerror=alert(1)>'), 'img tag shown as text');
assert.equal(await page.$$eval('main script, main img', (e) => e.length), 0);
assert.notEqual(await page.title(), 'pwned');
// The 1 MB string is clipped, the deep tree bounded, the page small.
assert.match(body, /Showing the first \d+ characters of 1\d{6} bytes/);
assert.match(body, /deeper steps not shown|more not shown/);
const html = await page.content();
assert.ok(html.length < 1_500_000, `page is ${html.length} bytes`);
// The step the soft-failing trace assertion points at is marked.
const marked = await page.$$('li.step.highlighted');
assert.ok(marked.length >= 1, 'a pointed step is highlighted');
assert.match(await marked[0].textContent(), /process_refund/);
// Failures are listed first, each with its explanation.
const first = await page.textContent('ol.members li:first-child');
assert.match(first, /hard_fail/);
// A thousand steps make a long page: the first screenful is kept.
await shot('evaluation', false);
step('failing evaluation with its trace');

// Runs, and the newest two compared.
await page.goto(`${base}/runs`);
assert.equal((await page.$$('table.runs tbody tr')).length, expect.runs);
await shot('runs');
// Compare the two sessions: choose them with the radio buttons.
const sessions = await page.$$eval('table.runs tbody tr', (trs) =>
  trs.filter((tr) => tr.children[1].textContent === 'session').map((tr) => tr.children[0].textContent.replace('#', '')));
assert.equal(sessions.length, 2);
const [newer, older] = sessions;
await page.check(`#a-${older}`);
await page.check(`#b-${newer}`);
await page.click('button:has-text("Compare the two chosen runs")');
await page.waitForURL(/\/compare\?/);
const newly = await page.textContent('section:has(#newly-failing)');
assert.ok(newly.includes('tone') && newly.includes('drifty'), newly);
const changes = await page.textContent('section:has(#deltas)');
assert.match(changes, /drifty[\s\S]*-0\.\d{3}/);
await shot('compare');
step('runs compared');

// Unknown pages say so.
r = await page.goto(`${base}/evaluation/999999`);
assert.equal(r.status(), 404);
assert.match(await page.textContent('#missing'), /no kept evaluation/);

assert.deepEqual(dialogs, []);
assert.deepEqual(offsite, []);
assert.deepEqual(errors, []);
await browser.close();
console.log('all viewer checks passed');
