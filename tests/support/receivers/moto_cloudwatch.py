"""Helper of tests/observe_cloud_b.rs: talks to a moto server started with
INITIAL_NO_AUTH_ACTION_COUNT=3 (signature checking enforced after three calls).

  moto_cloudwatch.py keys URL
      makes exactly three IAM calls (create_user, create_access_key, put_user_policy allowing
      everything) and prints the new access key id and secret on two lines;
  moto_cloudwatch.py stats URL REGION KEY SECRET NAMESPACE QUERY_JSON
      for each query {"name": ..., "dimensions": {...}} prints one JSON line with the
      datapoints boto3 get_metric_statistics returns (SampleCount, Sum, Minimum, Maximum),
      plus list_metrics of the namespace as the last line;
  moto_cloudwatch.py role URL KEY SECRET NAME
      creates IAM role NAME, assumable by anyone and allowed everything (moto refuses requests
      signed with credentials of a role it does not know).
"""
import datetime
import json
import sys

import boto3


def client(service, url, region, key="test", secret="test"):
    return boto3.client(service, endpoint_url=url, region_name=region,
                        aws_access_key_id=key, aws_secret_access_key=secret)


def keys(url):
    iam = client("iam", url, "us-east-1")
    iam.create_user(UserName="svc-observe")
    k = iam.create_access_key(UserName="svc-observe")["AccessKey"]
    iam.put_user_policy(UserName="svc-observe", PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
    print(k["AccessKeyId"])
    print(k["SecretAccessKey"])


def stats(url, region, key, secret, namespace, queries):
    cw = client("cloudwatch", url, region, key, secret)
    now = datetime.datetime.now(datetime.timezone.utc)
    for q in json.loads(queries):
        r = cw.get_metric_statistics(
            Namespace=namespace, MetricName=q["name"],
            Dimensions=[{"Name": k, "Value": v} for k, v in sorted(q["dimensions"].items())],
            StartTime=now - datetime.timedelta(hours=1), EndTime=now + datetime.timedelta(hours=1),
            Period=60, Statistics=["SampleCount", "Sum", "Minimum", "Maximum", "Average"])
        points = [{k: p[k] for k in ("SampleCount", "Sum", "Minimum", "Maximum", "Unit") if k in p}
                  for p in r["Datapoints"]]
        print(json.dumps({"name": q["name"], "dimensions": q["dimensions"], "datapoints": points}))
    metrics = cw.list_metrics(Namespace=namespace)["Metrics"]
    print(json.dumps(sorted(
        [{"name": m["MetricName"],
          "dimensions": {d["Name"]: d["Value"] for d in m.get("Dimensions", [])}} for m in metrics],
        key=lambda m: (m["name"], sorted(m["dimensions"].items())))))


def role(url, key, secret, name):
    iam = client("iam", url, "us-east-1", key, secret)
    iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "sts:AssumeRole"}]}))
    iam.put_role_policy(RoleName=name, PolicyName="all", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))


if __name__ == "__main__":
    if sys.argv[1] == "keys":
        keys(sys.argv[2])
    elif sys.argv[1] == "stats":
        stats(*sys.argv[2:8])
    elif sys.argv[1] == "role":
        role(*sys.argv[2:6])
    else:
        sys.exit("unknown command " + sys.argv[1])
