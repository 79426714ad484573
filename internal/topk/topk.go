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
