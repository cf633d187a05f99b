module github.com/plugd/plugd/test/interop/grpc127

go 1.26.8

require (
	google.golang.org/grpc v1.27.1
	google.golang.org/protobuf v1.36.12
)

require (
	github.com/golang/protobuf v1.5.0 // indirect
	golang.org/x/net v0.0.0-20190311183353-d8887717615a // indirect
	golang.org/x/sys v0.0.0-20190215142949-d0b11bdaac8a // indirect
	golang.org/x/text v0.3.0 // indirect
	google.golang.org/genproto v0.0.0-20190819201941-24fa4b261c55 // indirect
)
