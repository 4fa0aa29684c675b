// Drives the dashboard in headless Chromium (Debian's, through playwright-core): filters
// the dead letters, reads the count the page shows, replays the filtered set through the
// confirmation page, and reads the numbers again. Prints one JSON object on stdout.
//
//   node browser.cjs URL TOKEN DESTINATION ERROR_TEXT SCRIPT_MESSAGE_ID [SCREENSHOT_DIR]
//   node browser.cjs screenshot URL TOKEN SCREENSHOT_DIR   (the overview of a running relay)
//   node browser.cjs waiting URL TOKEN [SCREENSHOT_DIR]    (the waiting rows, as JSON)
//
// Environment: OUTBOX_TEST_CHROMIUM (the browser binary), NODE_PATH (playwright-core).
'use strict';

const { chromium } = require('playwright-core');

function launch() {
  return chromium.launch({
    executablePath: process.env.OUTBOX_TEST_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    timeout: 30000,
    // Root in a container, and a machine with no network: nothing to sandbox or fetch.
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

function signedIn(browser, token) {
  return browser.newContext({
    httpCredentials: { username: 'ops', password: token },
    viewport: { width: 1200, height: 760 },
  });
}

async function overview(url, token, shots) {
  const browser = await launch();
  try {
    const page = await (await signedIn(browser, token)).newPage();
    await page.goto(`${url}/`);
    await page.screenshot({ path: `${shots}/dashboard-overview.png`, fullPage: true });
  } finally {
    await browser.close();
  }
}

// The waiting page: its rows, the ones marked "no route", the last errors and next attempts.
async function waiting(url, token, shots) {
  const browser = await launch();
  try {
    const page = await (await signedIn(browser, token)).newPage();
    page.setDefaultTimeout(15000);
    await page.goto(`${url}/waiting`);
    const rows = page.locator('tr.waiting');
    const result = {
      rows: await rows.count(),
      unrouted: await page.locator('tr.waiting .unrouted').count(),
      retrying: await page.locator('tr.waiting:has-text("HTTP 503")').count(),
      nextAttempts: await page.locator('tr.waiting td:text-matches("^in [0-9]+m")').count(),
    };
    if (shots) await page.screenshot({ path: `${shots}/dashboard-waiting.png`, fullPage: true });
    process.stdout.write(JSON.stringify(result) + '\n');
  } finally {
    await browser.close();
  }
}

async function main() {
  if (process.argv[2] === 'screenshot') return overview(...process.argv.slice(3));
  if (process.argv[2] === 'waiting') return waiting(...process.argv.slice(3));
  const [url, token, destination, errorText, scriptId, shots] = process.argv.slice(2);
  const browser = await launch();
  const result = {};
  let page;
  try {
    page = await (await signedIn(browser, token)).newPage();
    page.setDefaultTimeout(15000);
    const dialogs = [];
    page.on('dialog', (d) => { dialogs.push(d.message()); d.dismiss(); });

    await page.goto(`${url}/`);
    result.overviewDead = await page.locator(`tr:has(td:text-is("${destination}")) td.n`).nth(3).innerText();

    await page.goto(`${url}/dead`);
    await page.fill('input[name=destination]', destination);
    await page.fill('input[name=error-contains]', errorText);
    await Promise.all([page.waitForNavigation(), page.click('#apply-filter')]);
    result.shown = Number(await page.locator('#match-count').innerText());
    result.rows = await page.locator('tr.letter').count();
    if (shots) await page.screenshot({ path: `${shots}/dashboard-dead-letters.png`, fullPage: true });

    await Promise.all([page.waitForNavigation(), page.click('#replay-all')]);
    result.confirm = Number(await page.locator('#confirm-count').innerText());
    if (shots) await page.screenshot({ path: `${shots}/dashboard-confirm.png` });
    await Promise.all([page.waitForNavigation(), page.click('#confirm')]);
    result.done = Number(await page.locator('#done-count').innerText());
    result.after = Number(await page.locator('#match-count').innerText());

    await page.goto(`${url}/`);
    result.overviewDeadAfter = await page.locator(`tr:has(td:text-is("${destination}")) td.n`).nth(3).innerText();

    await page.goto(`${url}/messages/${scriptId}`);
    result.payloadText = await page.locator('#payload').innerText();
    result.dialogs = dialogs;
  } catch (error) {
    // Say where the browser was and what it showed.
    if (page) process.stderr.write(`the browser was at ${page.url()}:\n${(await page.content()).slice(0, 4000)}\n`);
    throw error;
  } finally {
    await browser.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
