/*
 * kvs_proto.h - wire protocol of the leased one-sided key-value store
 * (ua_kvs_lease: kvs_server.c, kvs_client.c).  Segments are read with their
 * announced rkeys, the index through a per-client lease window; a lease ends
 * with the server's LOCAL_INV and a REVOKE sent as SEND_WITH_INV of the
 * client's mailbox window key.
 */
#ifndef KVS_PROTO_H
#define KVS_PROTO_H

#include <stdint.h>

#define KVS_PORT		"7471"
#define KVS_SEG_SIZE		(64UL << 20)
#define KVS_MAX_SEGS		16
#define KVS_INDEX_SIZE		(8UL << 20)
#define KVS_BUCKET_SIZE		64
#define KVS_MBOX_SIZE		4096
#define KVS_MAX_CLIENTS		64
#define KVS_CLIENT_CREDITS	16
#define KVS_LEASE_MS		2000

enum kvs_msg_type {
	KVS_MSG_HELLO = 1,	/* c->s: rkey/addr of the client's mailbox window */
	KVS_MSG_GRANT,		/* s->c: index window rkey/addr, epoch, lease length */
	KVS_MSG_SEGMENT,	/* s->c: segment number, rkey, addr */
	KVS_MSG_RENEW,		/* c->s */
	KVS_MSG_REVOKE,		/* s->c: SEND_WITH_INV of the mailbox key */
	KVS_MSG_BYE,		/* c->s: SEND_WITH_INV of the index window key */
};

struct kvs_msg {
	uint32_t	type;
	uint32_t	epoch;
	uint32_t	rkey;
	uint32_t	seg;
	uint64_t	addr;
	uint64_t	len;
	char		key[24];
	char		val[40];
};

#endif
