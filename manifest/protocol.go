package manifest

// FrameType is the frame type of a manifest on the manifest protocol
// (p2p.ProtoManifest): the asker opens a stream and reads one frame of this
// type holding Canonical's bytes (at most MaxSize), which it parses with
// Parse. Every member that has the manifest serves it, so a volunteer can
// join while the bootstrap is down.
const FrameType = 1
