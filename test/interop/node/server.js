// A plugin's registration server written with Node's @grpc/grpc-js, for
// plugd's interop tests (Go package interop starts it). It serves
// pluginregistration.Registration, loaded from the API's .proto
// (../testdata/api.proto, vendored from k8s.io/kubelet), on a unix socket,
// and reports each call on standard output as a JSON line. SIGTERM stops it
// gracefully.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

function parse(argv) {
  const opts = { type: 'CSIPlugin', name: 'interop.example.com', endpoint: '', versions: '', gzip: false, 'trailer-bytes': '0', 'notify-error': '' };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i].replace(/^--?/, '');
    if (flag === 'gzip') {
      opts.gzip = true;
    } else {
      opts[flag] = argv[++i];
    }
  }
  if (!opts.socket) {
    throw new Error('--socket is required');
  }
  return opts;
}

const opts = parse(process.argv.slice(2));
const versions = opts.versions ? opts.versions.split(',') : [];
const trailerBytes = parseInt(opts['trailer-bytes'], 10);

const def = protoLoader.loadSync(path.join(__dirname, '..', 'testdata', 'api.proto'), {
  keepCase: true,
  defaults: true,
});
const api = grpc.loadPackageDefinition(def).pluginregistration;

function emit(event) {
  process.stdout.write(JSON.stringify(event) + '\n');
}

function trailer() {
  const md = new grpc.Metadata();
  if (trailerBytes > 0) {
    md.set('x-interop-big', '{}'.repeat(trailerBytes / 2)); // what Huffman coding does not shorten
  }
  return md;
}

// 2 is gzip in grpc's compression algorithm numbering.
const server = new grpc.Server(opts.gzip ? { 'grpc.default_compression_algorithm': 2 } : {});
server.addService(api.Registration.service, {
  GetInfo(call, callback) {
    emit({ event: 'GetInfo' });
    callback(null, { type: opts.type, name: opts.name, endpoint: opts.endpoint, supported_versions: versions }, trailer());
  },
  NotifyRegistrationStatus(call, callback) {
    emit({ event: 'NotifyRegistrationStatus', registered: call.request.plugin_registered, error: call.request.error });
    if (opts['notify-error']) {
      callback({ code: grpc.status.FAILED_PRECONDITION, details: opts['notify-error'], metadata: trailer() });
      return;
    }
    callback(null, {}, trailer());
  },
});

server.bindAsync('unix:' + opts.socket, grpc.ServerCredentials.createInsecure(), (err) => {
  if (err) {
    process.stderr.write(`cannot listen on ${opts.socket}: ${err}\n`);
    process.exit(1);
  }
  emit({ event: 'listening' });
});

process.on('SIGTERM', () => {
  server.tryShutdown(() => {
    emit({ event: 'stopped' });
    process.exit(0);
  });
});
