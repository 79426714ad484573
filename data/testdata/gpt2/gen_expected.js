// gen_expected.js writes expected.jsonl, the reference ids of GPT2Tokenizer's
// tests, from cases.txt and from seeded random mixes of fragments:
//
//	cd "$(mktemp -d)" && npm install gpt-tokenizer@4.0.0 gpt-3-encoder@1.1.4
//	NODE_PATH=$PWD/node_modules node /path/to/data/testdata/gpt2/gen_expected.js
//
// The ids are gpt-tokenizer's r50k_base, a port of tiktoken (whole-piece
// lookup, then merges by the rank of the concatenated bytes). gpt-3-encoder,
// a port of OpenAI's original encoder.py (merges by the rank of the pair),
// encodes every case too; the script fails if the two disagree, except on
// the "pieces" cases of cases.txt, where both JavaScript encoders split
// differently from tiktoken and the pieces are encoded one by one.
//
// Each output line is {"text": T, "ids": [...]}, with "special": [...] (ids
// with <|endoftext|> as 50256, see special below) when T contains
// <|endoftext|>.
'use strict'
const fs = require('fs')
const path = require('path')
const r50k = require('gpt-tokenizer/encoding/r50k_base')
const g3 = require('gpt-3-encoder')

const ordinary = (s) => r50k.encode(s, { allowedSpecial: new Set(), disallowedSpecial: new Set() })
// tiktoken's encode with allowed_special="all": the stretches between
// <|endoftext|> each encoded on their own. (gpt-tokenizer 4.0.0's own
// allowedSpecial finds a special token only at the start of the text or
// right after another: its pattern is sticky.)
const special = (s) => s.split('<|endoftext|>').flatMap((part, i) => (i > 0 ? [50256] : []).concat(ordinary(part)))

const cases = []
for (const line of fs.readFileSync(path.join(__dirname, 'cases.txt'), 'utf8').split('\n')) {
  if (line.trim() === '' || line.startsWith('#')) continue
  const v = JSON.parse(line)
  if (typeof v === 'string') cases.push({ text: v })
  else if (v.pieces) cases.push({ text: v.pieces.join(''), pieces: v.pieces })
  else cases.push({ text: v.text.repeat(v.repeat) + (v.then || '') })
}

// Random mixes: mulberry32, seed 2.
let seed = 2
const rand = () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = seed
  t = Math.imul(t ^ (t >>> 15), t | 1)
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}
const fragments = [
  'the', 'The', ' quick', ' brown', 'fox', ' jumps', 'over', ' lazy', 'dog', 'token', 'izer', 'Skein',
  "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'LL", "'", '"', '`',
  ' ', ' ', ' ', '  ', '   ', '\t', '\t\t', '\n', '\n', '\r\n', '\n\n', ' \n', '\t\n', '\u000b', '\u000c',
  '0', '1', '42', '2024', '3.14', '1e9', '١٢٣', '½', '²', 'Ⅻ', '〇',
  'é', 'ß', 'ñ', 'Ω', 'Жук', '日本', '中文', '한국어', 'עברית', 'ع', 'हि', 'ǅ', 'ʰ', 'e\u0301', '\u0300',
  '🙂', '👍🏽', '🏳️‍🌈', '\u200d', '\u00a0', '\u3000', '\u2003', '\u2028',
  'x', 'y', '_', '-', '--', '==', '!=', '(', ')', '{', '}', '[', ']', ';', ':', ',', '.', '...', '/', '//',
  '#', '@', '$', '%', '^', '&', '*', '<|endoftext|>', '<|', '|>', '\u0000', '\u001f', '\u007f',
  'func', ' return', ' err', ' nil', 'if', ' := ', 'int32',
]
for (let i = 0; i < 200; i++) {
  const n = 1 + Math.floor(rand() * 25)
  let s = ''
  for (let j = 0; j < n; j++) s += fragments[Math.floor(rand() * fragments.length)]
  cases.push({ text: s })
}

const out = []
let disagree = 0
for (const c of cases) {
  let ids
  if (c.pieces) {
    ids = c.pieces.flatMap(ordinary)
  } else {
    ids = ordinary(c.text)
    const other = g3.encode(c.text)
    if (JSON.stringify(other) !== JSON.stringify(ids)) {
      disagree++
      console.error(`gpt-3-encoder differs on ${JSON.stringify(c.text)}: ${JSON.stringify(other)} vs ${JSON.stringify(ids)}`)
    }
  }
  const rec = { text: c.text, ids }
  if (c.text.includes('<|endoftext|>') && !c.pieces) rec.special = special(c.text)
  out.push(JSON.stringify(rec))
}
fs.writeFileSync(path.join(__dirname, 'expected.jsonl'), out.join('\n') + '\n')
console.error(`${out.length} cases, ${disagree} disagreements between gpt-tokenizer and gpt-3-encoder`)
if (disagree > 0) process.exit(1)
