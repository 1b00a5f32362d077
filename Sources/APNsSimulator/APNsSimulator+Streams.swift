import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2

/// What the simulator does with one request.
struct SimulatorAnswer {
    enum Action { case respond, hang, reset, goAway, drop }
    var status: Int
    var reason: String?
    var headers: [(String, String)] = []
    var body: [UInt8] = []
    var delay: Duration = .zero
    var action: Action = .respond

    static func error(_ status: Int, _ reason: String, extra: [String: Any] = [:]) -> SimulatorAnswer {
        var object: [String: Any] = ["reason": reason]
        for (key, value) in extra { object[key] = value }
        let body = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])).map(Array.init) ?? []
        return SimulatorAnswer(status: status, reason: reason, headers: [("content-type", "application/json")], body: body)
    }
}

extension APNsSimulator {
    func serveStream(_ stream: Stream, connectionID: Int, connection: any Channel) async {
        self.state.withLock { state in
            state.openStreams += 1
            state.maxOpenStreams = max(state.maxOpenStreams, state.openStreams)
        }
        defer { self.state.withLock { $0.openStreams -= 1 } }
        do {
            try await stream.executeThenClose { inbound, outbound in
                var headers = HPACKHeaders()
                var body: [UInt8] = []
                loop: for try await frame in inbound {
                    switch frame {
                    case .headers(let h):
                        headers = h.headers
                        if h.endStream { break loop }
                    case .data(let d):
                        if case .byteBuffer(let buffer) = d.data { body += buffer.readableBytesView }
                        if d.endStream { break loop }
                    default:
                        continue
                    }
                }
                let streamID = (try? await stream.channel.getOption(HTTP2StreamChannelOptions.streamID).get()).map { Int($0) } ?? 0
                let answer: SimulatorAnswer
                if self.configuration.fastMode {
                    answer = SimulatorAnswer(status: 200, reason: nil, headers: headers.first(name: "apns-id").map { [("apns-id", $0)] } ?? [])
                } else {
                    answer = self.answer(headers: headers, body: body, connectionID: connectionID, connection: connection)
                }
                if self.configuration.recordRequests {
                    self.record(headers: headers, body: body, connectionID: connectionID, streamID: streamID, answer: answer)
                }
                if answer.delay > .zero { try await Task.sleep(for: answer.delay) }
                switch answer.action {
                case .respond:
                    var responseHeaders = HPACKHeaders([(":status", String(answer.status))])
                    for (name, value) in answer.headers { responseHeaders.add(name: name, value: value) }
                    try await outbound.write(.headers(.init(headers: responseHeaders, endStream: answer.body.isEmpty)))
                    if !answer.body.isEmpty {
                        try await outbound.write(.data(.init(data: .byteBuffer(ByteBuffer(bytes: answer.body)), endStream: true)))
                    }
                case .hang:
                    try await Task.sleep(for: .seconds(3_600))
                case .reset:
                    try await outbound.write(.rstStream(.internalError))
                case .goAway:
                    let last = HTTP2StreamID(max(streamID - 2, 0))
                    let frame = HTTP2Frame(streamID: .rootStream, payload: .goAway(
                        lastStreamID: last, errorCode: .noError, opaqueData: ByteBuffer(string: #"{"reason":"Shutdown"}"#)))
                    try await connection.writeAndFlush(frame)
                    // Like APNs, finish the streams it processed before closing.
                    try await Task.sleep(for: .milliseconds(500))
                    connection.close(promise: nil)
                case .drop:
                    connection.close(promise: nil)
                }
            }
        } catch {
            self.logger.debug("simulator stream ended", metadata: ["push.error": "\(error)"])
        }
    }

    func record(headers: HPACKHeaders, body: [UInt8], connectionID: Int, streamID: Int, answer: SimulatorAnswer) {
        var plain: [String: String] = [:]
        for (name, value, _) in headers where name != "authorization" && !name.hasPrefix(":") { plain[name] = value }
        let jwt = headers.first(name: "authorization").map { String($0.dropFirst("bearer ".count)) }
        let claims = jwt.flatMap { token in self.state.withLock { $0.verifiedTokens[token] } }
        let request = RecordedRequest(
            connectionID: connectionID, streamID: streamID, method: headers.first(name: ":method") ?? "",
            path: headers.first(name: ":path") ?? "", headers: plain, hadAuthorization: jwt != nil, tokenIssuedAt: claims?.issuedAt, tokenKeyID: claims?.keyID,
            body: body, receivedAt: Date(), status: answer.action == .respond ? answer.status : 0, reason: answer.reason
        )
        self.state.withLock { $0.requests.append(request) }
    }
}
