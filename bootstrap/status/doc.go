// Package status owns a run's public history and its status page: a durable,
// bounded record of the volunteers' telemetry reports and of membership
// events (Store), the summary of the run computed from it (Snapshot), and the
// read-only HTTP surface that shows it (Server): an HTML page with a live loss
// curve, a JSON API, a server-sent-events stream and Prometheus metrics. Fetch
// and FormatText are the terminal's view of the same JSON (`skein status`).
//
// It must not touch libp2p, the model or training: the bootstrap (package
// bootstrap) receives reports and membership events over the network and
// hands them to Store.Record and Store.RecordEvent; it supplies the live
// member list through a callback. Nothing here is on a training critical
// path, and nothing here is trusted: every number and string in a report is a
// volunteer's claim, sanitized before it is stored or shown.
//
// # Use
//
//	st, err := status.Open(filepath.Join(dataDir, "history.db"), status.DefaultStoreConfig())
//	defer st.Close()
//	srv := status.NewServer(st, info, liveMembers, status.WithLogger(log))
//	hs := srv.HTTPServer(":8080") // timeouts set; Shutdown also ends the SSE streams
//	go hs.ListenAndServe()
//	...
//	err = st.Record(peerID, report, time.Now()) // refused reports: srv.CountRefused()
//	err = st.RecordEvent(status.Event{Peer: id, Kind: status.Join, Role: "trainer"})
//	srv.Notify() // membership changed (Record and RecordEvent notify by themselves)
//
// # Contract for callers
//
//  1. Record is called once per accepted report, with the bootstrap's own
//     clock; a second report of the same (peer, round) replaces the first.
//  2. The members callback is called while a snapshot is built: it must be
//     fast, must not block on the network and must not call into Server.
//  3. Close the Server (or Shutdown the http.Server that HTTPServer built)
//     before closing the Store.
//
// # What is kept, and the bounds
//
// All bounds are in StoreConfig; with the defaults the file stays below about
// 250 MB whatever the volunteers send.
//   - Per peer: its latest report, running totals, and its last
//     MaxReportsPerPeer reports keyed by round (a new report evicts the lowest
//     round; a report older than all kept ones, when the peer is at its cap,
//     is refused with ErrStale).
//   - At most MaxPeers peers; a new peer evicts the least recently seen one
//     and its reports. Run totals and round aggregates keep what evicted
//     reports contributed.
//   - Per round, an aggregate (counts, bytes, first and last time, up to 8
//     distinct state hashes with their votes, the state hash, losses,
//     tokens, data progress and bytes sent of the first 16 reports, and
//     the round's certified state). At most MaxRounds rounds: a new round
//     evicts the lowest one (the oldest history is dropped, not
//     downsampled; the page's curve is downsampled to at most 1000 points
//     when it is drawn).
//   - The last MaxEvents membership events.
//
// The store is a single bbolt file; reopening it gives back the same history.
// An in-memory mirror of the peers, of the round series (about 64 bytes a
// round) and of the latest events serves snapshots without disk reads,
// except the state-hash votes of the few rounds that the members are in.
//
// # What is believed
//
// A round's loss is the median over its reporters whose state is the
// round's certified state, its tokens their sum, and its data progress (a
// run over a packed dataset) the lower median of their (epoch, share
// trained) pairs; the run's tokens are the sum over rounds. The certified
// state is the round certificate's (StoreConfig.Certified: the bootstrap's,
// in a whole-model DiLoCo run) or, for a round without one, the hash a
// strict majority of the round's reporters announced, that majority also
// more than half of the current reporters (so a lone reporter certifies
// nothing in a run of several; hash 0, NoLoCo's and a staged run's, counts
// as a hash). The curve shows certified rounds only. A report more than
// MaxRoundLead rounds past the highest certified round (past the current
// reporters' round while no certified round is recent) is refused
// (ErrRoundAhead), and one claiming more than MaxRoundTokens tokens (the
// bootstrap sets what the manifest allows a member in a round) too
// (ErrTooManyTokens): one liar among five moves no loss or data progress
// out of the honest range, adds at most one member's tokens a round and
// draws no point ahead of the run.
//
// A round's bits per parameter, what one volunteer sends for the round per
// parameter of the model (RunInfo.ParamCount), is the median over its
// contributors (reporters that trained rather than adopted, whatever their
// state; of its first 16 reports) of 8 x bytes sent / parameters: a
// median, so that one volunteer that lies about its traffic (a huge or a
// zero byte count) cannot move it out of the honest members' range among
// three or more. Bytes sent are everything the volunteer's host sent since
// its previous report, every protocol and its framing included (the
// volunteer's round line prints the same figure). The snapshot shows the
// latest certified round's; there is none while the parameter count is 0
// or a round has no contributor.
//
// # Sanitizing
//
// A non-finite or absurd number is dropped (a loss that is NaN, infinite,
// negative or above 1e6 counts as not measured) or clamped (tokens, bytes,
// rates, seconds, member counts, the share of an epoch trained: see the
// limits in sanitize.go), so JSON encoding never fails and sums cannot
// overflow (they saturate). Strings lose control, format and invalid UTF-8
// characters and are cut to telemetry.MaxString bytes; peer IDs must be
// printable ASCII of at most 128 bytes. Nothing private is kept or shown:
// no IP addresses or multiaddrs of volunteers, only a short form of their
// peer IDs (ShortID).
package status
