import NIOCore

/// Turns many flushes issued in one event-loop tick into one: requests from many tasks each write and
/// flush their stream, and without this every request became its own TLS record and `write` syscall.
/// Sits between TLS and HTTP/2; costs at most one loop tick of latency.
final class FlushCoalescer: ChannelOutboundHandler, RemovableChannelHandler {
    typealias OutboundIn = NIOAny
    typealias OutboundOut = NIOAny

    private var flushPending = false

    func flush(context: ChannelHandlerContext) {
        guard !self.flushPending else { return }
        self.flushPending = true
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        context.eventLoop.execute {
            let (coalescer, context) = loopBound.value
            coalescer.flushPending = false
            context.flush()
        }
    }
}
