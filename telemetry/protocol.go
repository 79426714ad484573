package telemetry

// FrameType is the frame type of a report on the telemetry protocol
// (p2p.ProtoTelemetry): a volunteer opens a stream to a bootstrap, writes one
// frame of this type holding MarshalBinary's bytes (at most MaxReportSize)
// and closes it. There is no answer, so telemetry never slows training down.
const FrameType = 1
