import Foundation
import NIOCore
import NIOHPACK
import NIOHTTP2
import Synchronization

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
        return SimulatorAnswer(
            status: status,
            reason: reason,
            headers: [("content-type", "application/json")],
            body: body
        )
    }
}

extension APNsSimulator {
    func serveStream(_ stream: Stream, connectionID: Int, connection: any Channel) async {
        self.state.withLock { state in
            // A stream opened is a request made: the connection is no connect/disconnect churn.
            state.requestsPerConnection[connectionID, default: 0] += 1
            state.openStreams += 1
            state.maxOpenStreams = max(state.maxOpenStreams, state.openStreams)
        }
        // A stream counts as closed once its answer is about to be written: the client may open its next one as
        // soon as it reads it, before this task has ended (counted at the task's end, a limit of 2 read as 3).
        let counted = Mutex(true)
        let closeCount = {
            if counted.withLock({ open in
                defer { open = false }
                return open
            }) {
                self.state.withLock { $0.openStreams -= 1 }
            }
        }
        defer { closeCount() }
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
                let streamID =
                    (try? await stream.channel.getOption(HTTP2StreamChannelOptions.streamID).get()).map { Int($0) } ?? 0
                self.state.withLock { _ = $0.openStreamIDs[connectionID, default: []].insert(streamID) }
                defer { self.state.withLock { _ = $0.openStreamIDs[connectionID]?.remove(streamID) } }
                var answer: SimulatorAnswer
                let path = headers.first(name: ":path") ?? ""
                let isFCM = Self.isFCM(path)
                // The notification's id: apns-id (or apns-request-id), or an FCM message's data.push_id.
                let notificationID = isFCM ? Self.fcmPushID(body) : headers.notificationIDHeader?.value
                let fault =
                    self.configuration.faults.isActive
                    ? self.fault(for: headers, streamID: streamID, connectionID: connectionID, connection: connection)
                    : .none
                if case .silent = fault {
                    try await Task.sleep(for: .seconds(3_600))
                    return
                }
                if case .drop = fault {
                    self.state.withLock { _ = $0.faults.cutConnections.insert(connectionID) }
                    connection.close(promise: nil)
                    return
                }
                if case .reset = fault {
                    try await outbound.write(.rstStream(.internalError))
                    return
                }
                if case .respond(let status, let reason) = fault {
                    answer = isFCM ? Self.fcmError(status, Self.fcmCode(for: status)) : .error(status, reason)
                    if status == 429 { answer.headers.append(("retry-after", "1")) }
                } else if self.configuration.fastMode && isFCM {
                    answer =
                        path == Self.fcmTokenPath
                        ? self.grantAccessToken(body) : self.fcmSuccess(project: "fast")
                } else if self.configuration.fastMode {
                    answer = SimulatorAnswer(
                        status: 200,
                        reason: nil,
                        headers: headers.notificationIDHeader.map { [$0] } ?? []
                    )
                } else {
                    let certificate = await self.providerCertificate(connectionID: connectionID, connection: connection)
                    answer = self.answer(
                        headers: headers,
                        body: body,
                        connectionID: connectionID,
                        connection: connection,
                        certificate: certificate
                    )
                }
                if self.configuration.recordRequests {
                    self.record(
                        headers: headers,
                        body: body,
                        connectionID: connectionID,
                        streamID: streamID,
                        answer: answer
                    )
                }
                if case .slow(let latency) = fault { answer.delay = max(answer.delay, latency) }
                if answer.delay > .zero { try await Task.sleep(for: answer.delay) }
                // A stream above a GOAWAY's last-stream-id is never answered (Apple may keep the connection
                // open and stay silent on it). Deciding to answer commits the stream as processed, in the
                // same lock a GOAWAY takes to choose its last-stream-id, so no GOAWAY can land below it.
                // A scripted GOAWAY names the stream before this one as the last processed, or a later one
                // already being answered (this request then counts as processed too, and is answered).
                let decision = self.state.withLock { state -> (silent: Bool, sequence: Int, goAwayLast: Int?) in
                    if let goAway = state.goAways[connectionID], streamID > goAway.last {
                        state.faults.unansweredAfterGoAway += 1
                        return (true, 0, nil)
                    }
                    state.answerSequence += 1
                    var goAwayLast: Int?
                    if answer.action == .goAway {
                        let last =
                            state.goAways[connectionID]?.last
                            ?? max(streamID - 2, state.answeringStreamID[connectionID] ?? 0, 0)
                        state.goAways[connectionID] = state.goAways[connectionID] ?? (last, .now)
                        goAwayLast = last
                    }
                    if answer.action == .respond || (goAwayLast ?? 0) >= streamID {
                        state.answeringStreamID[connectionID] = max(
                            state.answeringStreamID[connectionID] ?? 0,
                            streamID
                        )
                    }
                    return (false, state.answerSequence, goAwayLast)
                }
                if decision.silent {
                    try await Task.sleep(for: .seconds(3_600))
                    return
                }
                func respond(_ answer: SimulatorAnswer) async throws {
                    var responseHeaders = HPACKHeaders([
                        (":status", String(answer.status)), ("date", Self.httpDate(self.configuration.now())),
                    ])
                    for (name, value) in answer.headers { responseHeaders.add(name: name, value: value) }
                    let okThenReset =
                        answer.status == 200 && answer.body.isEmpty && self.configuration.faults.okThenResetShare > 0
                        && self.state.withLock { state in
                            let reset =
                                Double.random(in: 0..<1, using: &state.faultRandom)
                                < self.configuration.faults.okThenResetShare
                            if reset { state.faults.okThenResets += 1 }
                            return reset
                        }
                    closeCount()
                    try await outbound.write(
                        .headers(.init(headers: responseHeaders, endStream: answer.body.isEmpty && !okThenReset))
                    )
                    if okThenReset { try await outbound.write(.rstStream(.noError)) }
                    if !answer.body.isEmpty {
                        try await outbound.write(
                            .data(.init(data: .byteBuffer(ByteBuffer(bytes: answer.body)), endStream: true))
                        )
                    }
                    if answer.status == 200, let id = notificationID {
                        self.state.withLock {
                            $0.faults.okAnswers[id.lowercased(), default: 0] += 1
                            $0.faults.okAnswerLog[id.lowercased(), default: []].append(
                                AnsweredOK(sequence: decision.sequence, connection: connectionID)
                            )
                            if let goAway = $0.goAways[connectionID], streamID > goAway.last {
                                $0.faults.answeredAboveGoAway += 1
                            }
                        }
                    }
                }
                switch answer.action {
                case .respond:
                    try await respond(answer)
                case .hang:
                    try await Task.sleep(for: .seconds(3_600))
                case .reset:
                    try await outbound.write(.rstStream(.internalError))
                case .goAway:
                    let last = decision.goAwayLast ?? 0
                    let frame = HTTP2Frame(
                        streamID: .rootStream,
                        payload: .goAway(
                            lastStreamID: HTTP2StreamID(last),
                            errorCode: .noError,
                            opaqueData: ByteBuffer(string: #"{"reason":"Shutdown"}"#)
                        )
                    )
                    try await connection.writeAndFlush(frame)
                    if last >= streamID {
                        try await respond(
                            isFCM
                                ? self.fcmSuccess(project: "processed")
                                : SimulatorAnswer(
                                    status: 200,
                                    reason: nil,
                                    headers: headers.notificationIDHeader.map { [$0] } ?? []
                                )
                        )
                    }
                    // Like APNs, finish the streams it processed before closing.
                    try await Task.sleep(for: .milliseconds(500))
                    self.state.withLock { _ = $0.faults.cutConnections.insert(connectionID) }
                    connection.close(promise: nil)
                case .drop:
                    self.state.withLock { _ = $0.faults.cutConnections.insert(connectionID) }
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
            connectionID: connectionID,
            streamID: streamID,
            method: headers.first(name: ":method") ?? "",
            path: headers.first(name: ":path") ?? "",
            headers: plain,
            hadAuthorization: jwt != nil,
            tokenIssuedAt: claims?.issuedAt,
            tokenKeyID: claims?.keyID,
            certificateTopic: self.state.withLock { $0.clientCertificates[connectionID] ?? nil }?.topic,
            body: body,
            receivedAt: Date(),
            status: answer.action == .respond ? answer.status : 0,
            reason: answer.reason
        )
        self.state.withLock { $0.requests.append(request) }
        self.deliverToLiveActivity(request)
    }
}

/// What the fault plan does with one request.
enum FaultAction {
    case none, silent, drop, reset
    case slow(Duration)
    case respond(Int, String)
}

extension APNsSimulator {
    /// Draws the fault plan's action for one request; sends GOAWAY itself when it is its turn.
    func fault(for headers: HPACKHeaders, streamID: Int, connectionID: Int, connection: any Channel) -> FaultAction {
        let plan = self.configuration.faults
        let now = ContinuousClock.now
        var goAwayLast: Int?
        let action = self.state.withLock { state -> FaultAction in
            // When the stream's HEADERS was read off the connection, not when this handler got to it (on a
            // machine the test suite loads, seconds later).
            let readAt =
                state.streamReadAt.removeValue(
                    forKey: SimulatorState.StreamKey(connection: ObjectIdentifier(connection), stream: streamID)
                ) ?? now
            if let goAway = state.goAways[connectionID] {
                state.faults.openedAfterGoAway += 1
                // Late only once the GOAWAY has reached the socket: before that the client cannot know.
                if let written = state.goAwayWrittenAt[connectionID] {
                    if readAt - written > .seconds(1) { state.faults.openedLateAfterGoAway += 1 }
                    state.faults.maxLatenessAfterGoAway = max(state.faults.maxLatenessAfterGoAway, readAt - written)
                }
                if streamID > goAway.last {
                    state.faults.unansweredAfterGoAway += 1
                    return .silent
                }
            }
            state.faultRequests += 1
            let n = state.faultRequests
            if let every = plan.dropEvery, every > 0, n % every == 0 {
                state.faults.drops += 1
                return .drop
            }
            if let every = plan.goAwayEvery, every > 0, n % every == 0, state.goAways[connectionID] == nil {
                // Below most of the streams in flight here: a quarter of them are answered, the rest never;
                // never below a stream already being answered (it was processed).
                let open = (state.openStreamIDs[connectionID] ?? []).sorted()
                let pivot = open.isEmpty ? streamID : open[open.count / 4]
                let last = max(pivot - 2, state.answeringStreamID[connectionID] ?? 0, 0)
                state.goAways[connectionID] = (last, now)
                state.faults.goAways += 1
                goAwayLast = last
                return streamID > last ? .silent : .none
            }
            let apnsID = headers.notificationIDHeader?.value.lowercased() ?? ""
            let first = state.seenAPNsIDs.insert(apnsID).inserted
            if first, plan.resetFirstAttempts > 0,
                Double.random(in: 0..<1, using: &state.faultRandom) < plan.resetFirstAttempts
            {
                state.faults.resets += 1
                return .reset
            }
            let roll = Double.random(in: 0..<1, using: &state.faultRandom)
            if roll < plan.throttleShare {
                state.faults.errors += 1
                return .respond(429, "TooManyRequests")
            }
            if roll < plan.throttleShare + plan.serverErrorShare {
                state.faults.errors += 1
                return Bool.random(using: &state.faultRandom)
                    ? .respond(500, "InternalServerError") : .respond(503, "ServiceUnavailable")
            }
            if roll < plan.throttleShare + plan.serverErrorShare + plan.slowShare { return .slow(plan.slowLatency) }
            return .none
        }
        if let last = goAwayLast {
            let frame = HTTP2Frame(
                streamID: .rootStream,
                payload: .goAway(
                    lastStreamID: HTTP2StreamID(last),
                    errorCode: .noError,
                    opaqueData: ByteBuffer(string: #"{"reason":"Shutdown"}"#)
                )
            )
            // Lateness counts from when the GOAWAY reached the socket: behind a backlog of answers on a
            // loaded machine it may leave much later than it was decided, and the client cannot read it
            // before then.
            let written = connection.eventLoop.makePromise(of: Void.self)
            written.futureResult.whenSuccess {
                self.state.withLock { $0.goAwayWrittenAt[connectionID] = .now }
            }
            connection.writeAndFlush(frame, promise: written)
            connection.eventLoop.scheduleTask(
                in: .nanoseconds(
                    Int64(plan.goAwayGrace.components.seconds) * 1_000_000_000 + plan.goAwayGrace.components.attoseconds
                        / 1_000_000_000
                )
            ) {
                self.state.withLock { _ = $0.faults.cutConnections.insert(connectionID) }
                connection.close(promise: nil)
            }
        }
        return action
    }
}

extension HPACKHeaders {
    /// The notification's id as the request carried it: `apns-id` on a device send, `apns-request-id` on a
    /// broadcast (Apple's broadcast requests name it so, and the answer echoes it under the same name).
    var notificationIDHeader: (name: String, value: String)? {
        if let id = self.first(name: "apns-id") { return ("apns-id", id) }
        if let id = self.first(name: "apns-request-id") { return ("apns-request-id", id) }
        return nil
    }
}

extension APNsSimulator {
    /// The `Date` header APNs sends (IMF-fixdate, whole seconds): the simulator's own clock, which a test may
    /// move to play a server whose clock differs from the worker's host.
    static func httpDate(_ date: Date) -> String {
        var time = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&time, &parts)
        let days = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"]
        let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
        func two(_ n: Int32) -> String { n < 10 ? "0\(n)" : "\(n)" }
        return
            "\(days[Int(parts.tm_wday)]), \(two(parts.tm_mday)) \(months[Int(parts.tm_mon)]) \(parts.tm_year + 1900) "
            + "\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec)) GMT"
    }
}
