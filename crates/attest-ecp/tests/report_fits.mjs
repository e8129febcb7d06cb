// Opens an ECP HTML report in Debian's headless Chromium (playwright-core,
// from PLAYWRIGHT_CORE) at a laptop's width and prints, as JSON, the page's
// width and every element whose content spills out of it sideways.
const { chromium } = await import(process.env.PLAYWRIGHT_CORE);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking'],
});
const page = await browser.newPage({ viewport: { width: 1024, height: 800 } });
await page.goto('file://' + process.argv[2]);
const seen = await page.evaluate(() => ({
  page: document.documentElement.scrollWidth,
  viewport: innerWidth,
  spilling: [...document.querySelectorAll('body *')]
    .filter((e) => e.clientWidth > 0 && e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX === 'visible')
    .map((e) => `${e.tagName.toLowerCase()}.${e.className}`),
  text: document.body.innerText,
}));
console.log(JSON.stringify(seen));
await browser.close();
