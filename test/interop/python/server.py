"""A plugin's registration server written with Python grpcio, for plugd's
interop tests (Go package interop starts it).

It serves pluginregistration.Registration on a unix socket and reports each
call on standard output as a JSON line. The messages are built from the
API's descriptor (--descriptor, a FileDescriptorSet that package interop
writes from k8s.io/kubelet's Go package): Debian ships grpcio and the
protobuf runtime, but no protoc to generate code with. SIGTERM stops it
gracefully.
"""

import argparse
import json
import signal
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool

try:
    from google.protobuf.message_factory import GetMessageClass
except ImportError:  # protobuf before 4.21
    from google.protobuf import message_factory

    def GetMessageClass(desc):
        return message_factory.MessageFactory(desc.file.pool).GetPrototype(desc)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--descriptor", required=True)
    p.add_argument("--type", default="CSIPlugin")
    p.add_argument("--name", default="interop.example.com")
    p.add_argument("--endpoint", default="")
    p.add_argument("--versions", default="")
    p.add_argument("--gzip", action="store_true")
    p.add_argument("--trailer-bytes", type=int, default=0)
    p.add_argument("--notify-error", default="")
    args = p.parse_args()

    pool = descriptor_pool.DescriptorPool()
    with open(args.descriptor, "rb") as f:
        for fd in descriptor_pb2.FileDescriptorSet.FromString(f.read()).file:
            pool.Add(fd)

    def message(name):
        return GetMessageClass(pool.FindMessageTypeByName("pluginregistration." + name))

    InfoRequest = message("InfoRequest")
    PluginInfo = message("PluginInfo")
    RegistrationStatus = message("RegistrationStatus")
    RegistrationStatusResponse = message("RegistrationStatusResponse")
    versions = [v for v in args.versions.split(",") if v]

    lock = threading.Lock()

    def emit(**event):
        with lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    def trailer(context):
        if args.trailer_bytes:
            # "{}" is what Huffman coding does not shorten.
            context.set_trailing_metadata((("x-interop-big", "{}" * (args.trailer_bytes // 2)),))

    def get_info(request, context):
        emit(event="GetInfo")
        trailer(context)
        return PluginInfo(type=args.type, name=args.name, endpoint=args.endpoint, supported_versions=versions)

    def notify(request, context):
        emit(event="NotifyRegistrationStatus", registered=request.plugin_registered, error=request.error)
        trailer(context)
        if args.notify_error:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, args.notify_error)
        return RegistrationStatusResponse()

    handler = grpc.method_handlers_generic_handler(
        "pluginregistration.Registration",
        {
            "GetInfo": grpc.unary_unary_rpc_method_handler(
                get_info,
                request_deserializer=InfoRequest.FromString,
                response_serializer=PluginInfo.SerializeToString,
            ),
            "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                notify,
                request_deserializer=RegistrationStatus.FromString,
                response_serializer=RegistrationStatusResponse.SerializeToString,
            ),
        },
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=4),
        compression=grpc.Compression.Gzip if args.gzip else None,
    )
    server.add_generic_rpc_handlers((handler,))
    if server.add_insecure_port("unix:" + args.socket) == 0:
        sys.exit("cannot listen on " + args.socket)
    server.start()

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emit(event="listening")
    stop.wait()
    server.stop(grace=5).wait()
    emit(event="stopped")


if __name__ == "__main__":
    main()
