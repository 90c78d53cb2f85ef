'use strict';
// npm pack/publish: the project's licence (LICENSE at the repository root)
// goes into the package.  Without it (a checkout without the file), the
// package is packed without and this says so.

const fs = require('node:fs');
const path = require('node:path');

const from = path.join(__dirname, '..', '..', '..', 'LICENSE');
const to = path.join(__dirname, '..', 'LICENSE');
if (fs.existsSync(from)) {
  fs.copyFileSync(from, to);
} else {
  process.stderr.write(`copy-license: ${from} not found, the package has no LICENSE file\n`);
}
