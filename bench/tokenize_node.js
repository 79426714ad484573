// tokenize_node.js times the npm GPT-2 encoder gpt-tokenizer on a text
// file, the counterpart of data's BenchmarkGPT2Encode (bench/tokenize.sh
// runs both):
//
//	NODE_PATH=DIR/node_modules node tokenize_node.js TEXT [GO_IDS.json]
//
// DIR holds `npm install gpt-tokenizer@4.0.0`. The encoder encodes the whole
// text once untimed (its merge cache warms, as Go's benchmark loop warms its
// own), then RUNS times (default 3); it prints the best MB/s (MB = 1e6
// bytes, as go test's MB/s). With GO_IDS, the output of `skein tokenize
// --tokenizer gpt2 TEXT`, it first checks that gpt-tokenizer gives the same
// ids.
'use strict'
const fs = require('fs')
const [file, goIDs] = process.argv.slice(2)
const runs = Number(process.env.RUNS || 3)
const buf = fs.readFileSync(file)
const text = buf.toString('utf8')
const r50k = require('gpt-tokenizer/encoding/r50k_base')
// gpt-3-encoder is left out: one call is quadratic (an Array.concat per
// piece), and even in 64 Ki-character calls it ran at 0.02 MB/s.
const encoders = {
  'gpt-tokenizer@4.0.0 r50k_base': (s) => r50k.encode(s, { allowedSpecial: new Set(), disallowedSpecial: new Set() }),
}

if (goIDs) {
  const want = encoders['gpt-tokenizer@4.0.0 r50k_base'](text)
  const got = JSON.parse(fs.readFileSync(goIDs, 'utf8'))
  let i = 0
  while (i < want.length && i < got.length && want[i] === got[i]) i++
  if (i < want.length || i < got.length) {
    console.log(`MISMATCH at id ${i} of ${want.length}: skein ${got.slice(i, i + 8)} vs gpt-tokenizer ${want.slice(i, i + 8)}`)
    process.exit(1)
  }
  console.log(`skein tokenize --tokenizer gpt2 and gpt-tokenizer agree on all ${want.length} ids of ${buf.length} bytes`)
}

for (const [name, encode] of Object.entries(encoders)) {
  let n = encode(text).length
  let best = Infinity
  for (let r = 0; r < runs; r++) {
    const t0 = process.hrtime.bigint()
    n = encode(text).length
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9)
  }
  console.log(`${name}: ${(buf.length / best / 1e6).toFixed(2)} MB/s, ${n} tokens, ${(buf.length / n).toFixed(3)} bytes/token (best of ${runs})`)
}
