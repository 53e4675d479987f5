#!/usr/bin/env python3
# Hostile review (atk-broker): measures the consumer sequence of redeliveries (NAK, AckWait)
# on each nats-server given: python3 tests/support/probes/redeliver_consumer_sequence.py $(which nats-server) ...
import socket, subprocess, sys, time, json, tempfile, os, re
def freeport():
    s=socket.socket(); s.bind(('127.0.0.1',0)); p=s.getsockname()[1]; s.close(); return p
def run(server):
    d=tempfile.mkdtemp(); port=freeport()
    p=subprocess.Popen([server,'-js','-sd',d,'-p',str(port),'-a','127.0.0.1'],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try: s=socket.create_connection(('127.0.0.1',port)); break
            except OSError: time.sleep(0.05)
        f=s.makefile('rb')
        f.readline()
        s.sendall(b'CONNECT {"verbose":false,"headers":true,"no_responders":true}\r\nSUB _R.> 1\r\n')
        buf=[]
        def req(subj, body, wait=True):
            s.sendall(f'PUB {subj} _R.x {len(body)}\r\n'.encode()+body+b'\r\n')
            if wait: return readmsg()
        def readmsg(timeout=3):
            s.settimeout(timeout)
            while True:
                line=f.readline()
                if not line: return None
                if line.startswith(b'PING'): s.sendall(b'PONG\r\n'); continue
                if line.startswith(b'MSG'):
                    parts=line.split(); n=int(parts[-1]); data=f.read(n+2)[:-2]
                    return parts, data
                if line.startswith(b'HMSG'):
                    parts=line.split(); n=int(parts[-1]); data=f.read(n+2)[:-2]
                    return parts, data
        print(req('$JS.API.STREAM.CREATE.S', json.dumps({"name":"S","subjects":["s.>"]}).encode())[1][:80])
        print(req('$JS.API.CONSUMER.DURABLE.CREATE.S.c', json.dumps({"stream_name":"S","config":{"durable_name":"c","ack_policy":"explicit","ack_wait":2_000_000_000,"filter_subject":"s.>"}}).encode())[1][:80])
        for i in range(3):
            s.sendall(b'PUB s.a 1\r\nx\r\n')
        s.sendall(b'PING\r\n'); 
        time.sleep(0.3)
        seqs=[]
        def pull(n):
            s.sendall(f'PUB $JS.API.CONSUMER.MSG.NEXT.S.c _R.p {len(json.dumps({"batch":n,"expires":500_000_000}))}\r\n{json.dumps({"batch":n,"expires":500_000_000})}\r\n'.encode())
            out=[]
            while True:
                m=readmsg(1.5)
                if m is None: break
                parts,data=m
                if parts[0]==b'MSG' and len(parts)==5 and parts[3].startswith(b'$JS.ACK'):
                    out.append(parts[3].decode())
                    if len(out)==n: break
                elif parts[0]==b'HMSG': break
            return out
        r=pull(3); print("first", r)
        # NAK the first two, ack third
        for rep in r[:2]: s.sendall(f'PUB {rep} 4\r\n-NAK\r\n'.encode())
        s.sendall(f'PUB {r[2]} 4\r\n+ACK\r\n'.encode())
        time.sleep(0.2)
        r2=pull(3); print("after NAK", r2)
        # let ack wait expire for one
        for rep in r2[1:]: s.sendall(f'PUB {rep} 4\r\n+ACK\r\n'.encode())
        time.sleep(2.5)
        r3=pull(3); print("after AckWait", r3)
        for line in r+r2+r3:
            t=line.split('.'); print(" delivered=%s sseq=%s cseq=%s"%(t[4],t[5],t[6]))
    finally:
        p.terminate(); p.wait()
for srv in sys.argv[1:]:
    print("==",srv, subprocess.run([srv,'--version'],capture_output=True,text=True).stdout.strip())
    run(srv)
