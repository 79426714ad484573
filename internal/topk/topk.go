// Package topk selects the largest of a set of distinct integer keys in
// linear expected time (a quickselect), for the sparse codec and the
// shared support, which both pack (magnitude bits, inverted index) into
// uint64 keys so that ties break by index and every machine picks the
// same elements. It owns nothing else and imports nothing of Skein.
package topk

// Largest returns the k largest of keys (which must be distinct), in no
// particular order, reordering keys in place; 0 < k <= len(keys).
func Largest(keys []uint64, k int) []uint64 {
	lo, hi, target := 0, len(keys)-1, k-1 // target: the k-th largest's position, descending
	for lo < hi {
		a, b, c := keys[lo], keys[lo+(hi-lo)/2], keys[hi]
		p := max(min(a, b), min(max(a, b), c)) // median of three
		i, j := lo, hi
		for i <= j {
			for keys[i] > p {
				i++
			}
			for keys[j] < p {
				j--
			}
			if i <= j {
				keys[i], keys[j] = keys[j], keys[i]
				i++
				j--
			}
		}
		switch {
		case target <= j:
			hi = j
		case target >= i:
			lo = i
		default:
			return keys[:k]
		}
	}
	return keys[:k]
}

// Top keeps the k largest of the keys pushed into it, a min-heap: a stream
// of n keys costs one comparison each against Floor and O(log k) for the
// few that beat it (about k ln(n/k) in random order), where Largest first
// needs them all in memory. Keys must be distinct and non-zero.
type Top struct {
	k int
	h []uint64
}

// Reset empties t and makes it keep the k largest (k > 0).
func (t *Top) Reset(k int) {
	t.k, t.h = k, t.h[:0]
}

// Floor is the key a pushed key must exceed to be kept: 0 while fewer than
// k are held, then the smallest held.
func (t *Top) Floor() uint64 {
	if len(t.h) < t.k {
		return 0
	}
	return t.h[0]
}

// Push offers key; callers test key > Floor() first, so that the common
// case costs no call.
func (t *Top) Push(key uint64) {
	h := t.h
	if len(h) < t.k {
		h = append(h, key)
		for i := len(h) - 1; i > 0; { // sift up
			p := (i - 1) / 2
			if h[p] <= h[i] {
				break
			}
			h[p], h[i] = h[i], h[p]
			i = p
		}
		t.h = h
		return
	}
	if key <= h[0] {
		return
	}
	h[0] = key
	for i := 0; ; { // sift down
		l, s := 2*i+1, i
		if l < len(h) && h[l] < h[s] {
			s = l
		}
		if r := l + 1; r < len(h) && h[r] < h[s] {
			s = r
		}
		if s == i {
			break
		}
		h[i], h[s] = h[s], h[i]
		i = s
	}
}

// Keys are the keys held, in no particular order (t's memory: valid until
// the next Push or Reset).
func (t *Top) Keys() []uint64 { return t.h }
