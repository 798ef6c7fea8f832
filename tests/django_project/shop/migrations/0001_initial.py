from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True
    dependencies = [("notifyq", "0001_initial")]
    operations = [
        migrations.CreateModel(name="Order", fields=[
            ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
            ("name", models.CharField(max_length=100))]),
        migrations.CreateModel(name="Handled", fields=[
            ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False)),
            ("job_id", models.BigIntegerField()),
            ("connection_id", models.BigIntegerField()),
            ("started", models.FloatField())]),
    ]
