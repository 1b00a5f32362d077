import ArgumentParser
import Foundation
import Logging
import OTel
import PushWorker
import ServiceLifecycle

/// `push-worker run`'s trace export (CONTRACT.md 1c): off unless `--otlp-endpoint` is given.
struct TraceOptions: ParsableArguments {
    @Option(
        name: .customLong("otlp-endpoint"),
        help: ArgumentHelp(
            "Export a span for each attempt of a job that carries a traceparent, over OTLP/HTTP, to this collector (e.g. http://otel-collector:4318; /v1/traces is added to a URL without a path). Without it, no span is made. The OTEL_EXPORTER_OTLP_* variables tune the exporter (OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/json, OTEL_BSP_SCHEDULE_DELAY, headers, certificate).",
            valueName: "url"
        )
    ) var otlpEndpoint: String?

    func validate() throws {
        guard let endpoint = self.otlpEndpoint else { return }
        guard let url = URL(string: endpoint), let scheme = url.scheme, ["http", "https"].contains(scheme),
            url.host?.isEmpty == false
        else {
            throw ValidationError(
                "--otlp-endpoint \(endpoint): give the collector's http:// or https:// URL, e.g. http://otel-collector:4318"
            )
        }
    }

    /// The URL spans are POSTed to: a base URL gets OTLP/HTTP's `/v1/traces`.
    var tracesURL: String? {
        guard let endpoint = self.otlpEndpoint, let url = URL(string: endpoint) else { return nil }
        return url.path.isEmpty || url.path == "/"
            ? endpoint.trimmingCharacters(in: CharacterSet(charactersIn: "/")) + "/v1/traces" : endpoint
    }

    /// The tracer and the exporter's service (run it in the daemon's group), or `nil` without an endpoint.
    func backend(serviceName: String, logger: Logger) throws -> (tracing: AttemptTracing, service: any Service)? {
        guard let url = self.tracesURL else { return nil }
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName
        // The exporter's own warnings (a collector unreachable, a batch dropped) go to the worker's log, in its
        // format, at warning and above.
        configuration.diagnosticLogger = .custom(logger)
        configuration.diagnosticLogLevel = .warning
        configuration.metrics.enabled = false
        configuration.logs.enabled = false
        configuration.traces.enabled = true
        configuration.traces.exporter = .otlp
        configuration.traces.otlpExporter.endpoint = url
        configuration.traces.otlpExporter.protocol = .httpProtobuf
        // A producer's sampled flag decides; an unsampled trace gets no span.
        configuration.traces.sampler = .parentBasedAlwaysOn
        let backend = try OTel.makeTracingBackend(configuration: configuration)
        return (AttemptTracing(tracer: backend.factory), backend.service)
    }
}
